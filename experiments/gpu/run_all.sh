#!/usr/bin/env bash
# Everything issue 6 needs from a GPU session, in one command that keeps to its time budget:
#
#   run(command="bash experiments/gpu/run_all.sh $OUT", carry=[".whl"],
#       kind="nvidia-h100-x1", timeout_s=600)
#
# 1. installs chainer (the carried wheel, built here by build_wheels.sh) and this project
#    offline into /tmp/pooch-site (pip --no-index --no-deps --target; PYTHONPATH), without
#    touching the machine's own packages (NumPy 2, CuPy 14, pandas, matplotlib, ...);
# 2. prints the versions and the GPU;
# 3. runs the GPU tests (pytest -m gpu), then make demo's script on the GPU and
#    experiments/fidelity.py --device cupy (POOCH_SKIP_DEMO=1, POOCH_SKIP_FIDELITY=1 skip them);
# 4. runs experiments/gpu/measure.py (profiles, link emulation, runs at budgets, fidelity);
# 5. packs OUT for the trip back (at most 8 files, two folders deep): results.tar.gz holding
#    everything, plus runs.csv, targets.csv, profiles.csv, link.csv and the three logs.
#
# Each step has its own time limit inside POOCH_GPU_BUDGET_S (default 540 s), so a hang
# cannot eat the session; measure.py also stops starting runs it could not finish.
#   --cpu   the same steps on the host-simulated device (measure.py --cpu --tiny): the CPU
#           test of this script. POOCH_INSTALL=0 skips step 1 (use the current interpreter).
# For a second call in the same session: POOCH_SKIP_TESTS=1 skips step 3, and
# POOCH_MEASURE_ARGS adds options to measure.py, e.g. "--problems resnet50:128 --iters 3".
# POOCH_GPU_POOL_HEADROOM=1.6 (a diagnostic) lets the pool take that times each budget, so
# budgeted runs go on past CuPy's fragmentation and measure what the plans hold.
set -u
OUT=${1:?usage: run_all.sh OUT [--cpu]}
MODE=${2:-gpu}
cd "$(dirname "$0")/../.."
T0=$(date +%s)
BUDGET=${POOCH_GPU_BUDGET_S:-540}
PY=${PYTHON:-python3}
SITE=${POOCH_SITE:-/tmp/pooch-site}
WHEEL=.whl/chainer-7.8.1-py3-none-any.whl
WORK="$OUT/work"
mkdir -p "$WORK"
# CUBLAS_WORKSPACE_CONFIG: cuBLAS stays bit-reproducible whatever the streams (bit-identity checks)
export PYTHONUNBUFFERED=1 CHAINER_CUDNN=0 MPLBACKEND=Agg CUBLAS_WORKSPACE_CONFIG=:4096:8

left() { echo $((BUDGET - ($(date +%s) - T0))); }
stamp() { echo "[run_all $(date +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*"; }
cap() { local want=$1 have; have=$(( $(left) - $2 )); [ "$have" -lt "$want" ] && want=$have; [ "$want" -lt 5 ] && want=5; echo "$want"; }

# 1. install -------------------------------------------------------------------------------
if [ "${POOCH_INSTALL:-1}" = 1 ]; then
    if [ ! -f "$WHEEL" ]; then
        stamp "no $WHEEL: run experiments/gpu/build_wheels.sh where pip has network, and carry .whl"
        [ "$MODE" = --cpu ] || exit 2
    else
        stamp "installing chainer and pooch-ext offline into $SITE"
        rm -rf "$SITE"
        if ! timeout 120 "$PY" -m pip install -q --no-index --no-deps --no-build-isolation \
                --no-compile --no-cache-dir --target "$SITE" "$WHEEL" . > "$WORK/install.log" 2>&1; then
            # no setuptools/wheel to build the project with: the wheel, then the sources as they
            # install (hooks/ is the package pooch_ext.hooks; pooch_ext/_compat.py imports the
            # top-level _pooch_ext_chainer_hook)
            stamp "pip could not build the project (see install.log); copying its sources"
            timeout 60 "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" \
                "$WHEEL" >> "$WORK/install.log" 2>&1 || { stamp "chainer wheel did not install"; exit 2; }
            cp -r pooch_ext "$SITE/pooch_ext" && cp -r hooks "$SITE/pooch_ext/hooks" \
                && cp _pooch_ext_chainer_hook.py "$SITE/"
        fi
        export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    fi
fi

# 2. versions ------------------------------------------------------------------------------
{
    stamp "versions"
    timeout 60 "$PY" -P -c '
import sys, numpy, pandas, matplotlib, pooch_ext, chainer
print("python", sys.version.split()[0], sys.executable)
print("numpy", numpy.__version__, "pandas", pandas.__version__, "matplotlib", matplotlib.__version__)
print("chainer", chainer.__version__, "pooch_ext", pooch_ext.__file__)
try:
    import cupy
    from chainer.backends import cuda
    print("cupy", cupy.__version__, "devices", cupy.cuda.runtime.getDeviceCount(),
          "chainer cuda.available", cuda.available, "cudnn", cuda.cudnn_enabled)
except Exception as error:
    print("cupy unusable:", type(error).__name__, error)
'
    command -v nvidia-smi > /dev/null && timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv
} > "$WORK/env.txt" 2>&1
cat "$WORK/env.txt"

# 3. GPU tests -----------------------------------------------------------------------------
if [ "${POOCH_SKIP_TESTS:-0}" = 1 ]; then
    echo "skipped (POOCH_SKIP_TESTS=1)" > "$WORK/pytest-gpu.log"
else
    T=$(cap 150 300)
    stamp "pytest -m gpu (limit ${T}s)"
    # only the modules that hold GPU tests: collecting the whole suite costs seconds
    # (test_experiments.py last: its quick fidelity run is the slowest, and a cut keeps the rest)
    mapfile -t GPU_TESTS < <(grep -l "mark.gpu" tests/test_*.py | grep -v test_experiments; \
                             grep -l "mark.gpu" tests/test_experiments.py)
    # -o pythonpath=: pytest.ini puts the checkout first, whose pooch_ext has no hooks/ (only
    # an install maps hooks/ to pooch_ext.hooks): the installed package first, the checkout
    # after it (tests import helpers as tests.test_inplace)
    PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" timeout --kill-after=10 "$T" "$PY" -P -m pytest -q -o pythonpath= \
        -m gpu "${GPU_TESTS[@]}" \
        > "$WORK/pytest-gpu.log" 2>&1
    stamp "pytest exit $? ($(tail -1 "$WORK/pytest-gpu.log"))"
fi

# 3b. the main job on the GPU: make demo's script (plain Chainer and PoocH side by side) --------
if [ "${POOCH_SKIP_DEMO:-0}" != 1 ] && [ "$MODE" != --cpu ]; then
    T=$(cap 90 240)
    stamp "demo on the GPU (limit ${T}s)"
    timeout --kill-after=10 "$T" "$PY" -P -m pooch_ext.demo --out "$WORK/demo" \
        > "$WORK/demo.log" 2>&1
    stamp "demo exit $? ($(tail -1 "$WORK/demo.log"))"
    # the same with the experimental arena allocator (hooks/arena.py), side by side
    T=$(cap 60 240)
    POOCH_GPU_ARENA=1 timeout --kill-after=10 "$T" "$PY" -P -m pooch_ext.demo \
        --out "$WORK/demo_arena" > "$WORK/demo_arena.log" 2>&1
    stamp "demo with the arena exit $? ($(tail -1 "$WORK/demo_arena.log"))"
    # the pool's fragmentation on the demo's own malloc/free log (offline, seconds)
    [ -f "$WORK/demo/allocations.csv" ] && timeout 60 "$PY" -P experiments/gpu/pool_strategies.py \
        "$WORK/demo/allocations.csv" > "$WORK/pool_strategies.txt" 2>&1 && cat "$WORK/pool_strategies.txt"
fi

# 3c. the simulator's fidelity on the CuPy device (experiments/fidelity.py --device cupy), ----
# one network per call so a cut keeps the networks already measured
if [ "${POOCH_SKIP_FIDELITY:-0}" != 1 ] && [ "$MODE" != --cpu ]; then
    for NET in small-resnet branchy lstm; do
        T=$(cap 70 200)
        stamp "fidelity --device cupy --network $NET (limit ${T}s)"
        timeout --signal=INT --kill-after=10 "$T" "$PY" -P experiments/fidelity.py \
            --device cupy --network "$NET" --repeats "${POOCH_FIDELITY_REPEATS:-1}" \
            --out "$WORK/fidelity_$NET" > "$WORK/fidelity_$NET.log" 2>&1
        stamp "fidelity $NET exit $?"
        tail -25 "$WORK/fidelity_$NET.log"
    done
fi

# 3d. split exactness keys: a planned op that probes its split's exactness inside the op (a key
# the measurement missed, as cover_all did on the first H200) holds memory no plan counts
if [ "${POOCH_SKIP_FIDELITY:-0}" != 1 ] && [ "$MODE" != --cpu ]; then
    T=$(cap 40 150)
    stamp "diagnose_split_keys --gpu (limit ${T}s)"
    timeout --kill-after=10 "$T" "$PY" -P experiments/gpu/diagnose_split_keys.py --gpu \
        > "$WORK/split_keys.log" 2>&1
    stamp "split keys exit $? ($(grep -m1 "exactness checks" "$WORK/split_keys.log"))"
fi

# 3e. where a GPU plan holds more than predicted (session 30: pooch +15%, swap-all +10%,
# superneurons exact, ResNet-50 b160 at a third): every malloc and free with the executor's
# actions, the profile and the plan, the pool's limit off (POOCH_SKIP_DIAGNOSE=1 skips;
# POOCH_DIAGNOSE_ARGS replaces "resnet50 160 6993853440 pooch superneurons")
if [ "${POOCH_SKIP_DIAGNOSE:-0}" != 1 ] && [ "$MODE" != --cpu ]; then
    T=$(cap 120 150)
    stamp "diagnose_memory --log-dir (limit ${T}s)"
    # shellcheck disable=SC2086  # split on purpose: arguments
    timeout --kill-after=10 "$T" "$PY" -P experiments/gpu/diagnose_memory.py \
        ${POOCH_DIAGNOSE_ARGS:-resnet50 160 6993853440 pooch superneurons} \
        --log-dir "$WORK/diagnose" > "$WORK/diagnose.log" 2>&1
    stamp "diagnose exit $? ($(grep -c "^==" "$WORK/diagnose.log") runs)"
    grep -A3 "^==" "$WORK/diagnose.log" | cut -c1-200
fi

# 4. measurements --------------------------------------------------------------------------
T=$(cap 600 45)
EXTRA=()
[ "$MODE" = --cpu ] && EXTRA=(--cpu --tiny)
# shellcheck disable=SC2206  # split on purpose: options
EXTRA+=(${POOCH_MEASURE_ARGS:-})
stamp "measure.py (limit ${T}s)"
timeout --signal=INT --kill-after=15 "$T" "$PY" -P experiments/gpu/measure.py "$WORK" \
    --deadline-s $((T - 25)) "${EXTRA[@]}" > "$WORK/measure.log" 2>&1
CODE=$?
tail -40 "$WORK/measure.log"
stamp "measure.py exit $CODE"
if [ "$CODE" != 0 ] && [ -f "$WORK/runs.csv" ]; then
    timeout 60 "$PY" -P experiments/gpu/measure.py "$WORK" --report-only >> "$WORK/measure.log" 2>&1
fi

# 5. pack ----------------------------------------------------------------------------------
tar -czf "$OUT/results.tar.gz" -C "$OUT" work
if [ "$(stat -c %s "$OUT/results.tar.gz")" -gt $((15 * 1024 * 1024)) ]; then
    stamp "results.tar.gz over 15 MiB: packing without the saved profiles"
    tar -czf "$OUT/results.tar.gz" -C "$OUT" --exclude=work/profiles work
fi
for f in runs.csv targets.csv profiles.csv link.csv measure.log pytest-gpu.log env.txt; do
    [ -f "$WORK/$f" ] && cp "$WORK/$f" "$OUT/$f"
done
rm -rf "$WORK"
stamp "done; files back: $(cd "$OUT" && ls | tr '\n' ' ')"
[ -f "$OUT/targets.csv" ] && cat "$OUT/targets.csv"
exit 0
