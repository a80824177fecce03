# Two commands do all the set-up on a fresh machine:
#   make demo   train the small residual CNN under PoocH (GPU if present, else host-simulated)
#   make test   the test suite (GPU-only tests skip without CUDA)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
MPI_STAMP := $(VENV)/.installed-mpi-stamp
MPIEXEC := $(BIN)/mpiexec
# chainer 7.8.1 is an sdist whose build imports pkg_resources: pin setuptools < 81 for its build
# (PIP_CONSTRAINT for pip < 25.3, PIP_BUILD_CONSTRAINT for newer pip).
PIPENV := PIP_CONSTRAINT=$(CURDIR)/constraints.txt PIP_BUILD_CONSTRAINT=$(CURDIR)/constraints.txt \
          PIP_DISABLE_PIP_VERSION_CHECK=1

.PHONY: install demo test test-slow lint experiments bench gpu-wheels clean demo-mpi test-mpi

install: $(STAMP)

$(STAMP): setup.py constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIPENV) $(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m pooch_ext.demo

# one BLAS thread per test worker: two workers with a thread per core each would share the
# two cores four ways (the suite took twice as long)
TEST_ENV = OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
# the suite but the tests marked slow (the experiment scripts end to end, every example
# network, the demo): within 3 minutes on 2 cores; CI runs test-slow after it
test: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -q -n 2 -m "not mpi and not slow"

test-slow: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -q -n 2 -m "slow and not mpi"

# data-parallel (ChainerMN over MPI, CPU): the environment gains the `mpi` extra
$(MPI_STAMP): $(STAMP)
	$(PIPENV) $(BIN)/python -m pip install -q -e '.[test,mpi]'
	touch $(MPI_STAMP)

demo-mpi: $(MPI_STAMP)
	OPENBLAS_NUM_THREADS=1 $(MPIEXEC) -n 2 $(BIN)/python -m pooch_ext.demo_mpi

# the MPI tests: 2 and 4 processes under mpiexec (tests/test_mpi.py starts them)
test-mpi: $(MPI_STAMP)
	POOCH_REQUIRE_MPI=1 $(BIN)/python -m pytest -q -m mpi tests/test_mpi.py

# ruff (ruff.toml) on everything, mypy (mypy.ini) on the planning core
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

experiments: $(STAMP)
	$(BIN)/python experiments/run_all.py

bench: $(STAMP)
	$(BIN)/python experiments/bench_classify.py
	OPENBLAS_NUM_THREADS=1 $(BIN)/python experiments/planner_scale.py
	OPENBLAS_NUM_THREADS=1 $(BIN)/python experiments/monotone_random.py
	$(BIN)/python experiments/bench_overhead.py

# chainer's pure-Python wheel for a GPU machine without network (experiments/gpu/, results/gpu/)
gpu-wheels:
	bash experiments/gpu/build_wheels.sh

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
