"""pooch-ext: profiling-based out-of-core training (PoocH) for Chainer 7."""
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

# every package under pooch_ext/ (found, so a new one cannot be left out of a wheel), and
# hooks/, which installs as pooch_ext.hooks (package_dir below)
PACKAGES = find_packages(include=["pooch_ext", "pooch_ext.*"]) + ["pooch_ext.hooks"]

# One line run at interpreter start-up from site-packages: it only installs a meta-path finder
# (nothing is imported), so that ``import chainer`` works on NumPy 2 without importing pooch_ext
# first (_pooch_ext_chainer_hook.py, pooch_ext/_compat.py). Its name sorts after setuptools'
# ``__editable__.*.pth``, whose finder must already be in place for an editable install.
PTH_NAME = "pooch_ext_chainer.pth"
PTH_LINE = "import _pooch_ext_chainer_hook; _pooch_ext_chainer_hook.install()\n"


class BuildPyWithPth(build_py):
    """build_py that also writes PTH_NAME to the top of the installed tree: into build_lib for
    a wheel (``pip install .``), and into the editable wheel itself for ``pip install -e .``
    (setuptools >= 64 leaves build_lib out of it and builds the wheel in install_lib)."""

    def run(self) -> None:
        super().run()
        folders = [self.build_lib]
        if getattr(self, "editable_mode", False):
            folders.append(self.get_finalized_command("install").install_lib)
        for folder in folders:
            Path(folder).mkdir(parents=True, exist_ok=True)
            Path(folder, PTH_NAME).write_text(PTH_LINE)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return super().get_outputs(include_bytecode) + [str(Path(self.build_lib, PTH_NAME))]


setup(
    name="pooch-ext",
    version="0.1.0",
    description="Profiling-based out-of-core hybrid training (keep / swap / recompute) for Chainer",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=PACKAGES,
    py_modules=["_pooch_ext_chainer_hook"],
    cmdclass={"build_py": BuildPyWithPth},
    # hooks/ lives at the top level of the repository (it is the part that touches
    # Chainer and CuPy at run time) but installs as pooch_ext.hooks.
    package_dir={"pooch_ext.hooks": "hooks"},
    # compiled on first use (pooch_ext/cbuild.py): the CPU device's counting NumPy allocator
    # (hooks/cpu_memory.py) and the simulator's hot loops (pooch_ext/sim/clib.py)
    package_data={"pooch_ext.hooks": ["cpu_memory.c"], "pooch_ext.sim": ["walk.c"]},
    install_requires=[
        "chainer==7.8.1",
        "numpy>=1.26",
        "pandas>=2.0",
        "matplotlib>=3.7",
        "tqdm>=4.60",
        "scipy>=1.10",
    ],
    extras_require={
        # pytest-xdist: the suite runs on both cores (make test -n 2), half the wall time
        # ruff + mypy: `make lint` (CI runs it after the tests), config in ruff.toml, mypy.ini
        "test": ["pytest>=7", "pytest-xdist>=3", "ruff>=0.5", "mypy>=1.8"],
        "cuda12": ["cupy-cuda12x>=13"],
        "cuda13": ["cupy-cuda13x>=14"],
        # data-parallel training (ChainerMN, bundled with chainer): MPI from the package
        # index, a wheel each (mpich brings mpiexec; mpi4py 4 loads its libmpi)
        "mpi": ["mpi4py>=4", "mpich>=4"],
    },
    entry_points={"console_scripts": ["pooch-ext=pooch_ext.cli:main"]},
)
