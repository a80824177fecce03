#!/usr/bin/env bash
# Build, here (with network), the one wheel the GPU machine lacks and cannot fetch: chainer 7.8.1.
#
# chainer 7.8.1 is an sdist whose setup.py imports pkg_resources, so it is built with
# setuptools < 81 (constraints.txt, passed both ways pip reads build constraints). The result is
# a pure-Python wheel (~1 MB) in .whl/, which git ignores (.git/info/exclude) and the device tool
# carries: run(..., carry=[".whl"]). Idempotent: an existing wheel is kept.
#
#   bash experiments/gpu/build_wheels.sh          # PYTHON=... to build with another interpreter
set -euo pipefail
cd "$(dirname "$0")/../.."

WHEEL=.whl/chainer-7.8.1-py3-none-any.whl
EXCLUDE=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$EXCLUDE")"
grep -qxF '/.whl/' "$EXCLUDE" 2>/dev/null || echo '/.whl/' >> "$EXCLUDE"

if [ -f "$WHEEL" ]; then
    echo "build_wheels: $WHEEL is already there"
    exit 0
fi
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
mkdir -p .whl
PIP_CONSTRAINT="$PWD/constraints.txt" PIP_BUILD_CONSTRAINT="$PWD/constraints.txt" \
    "$PY" -m pip wheel -q --no-deps chainer==7.8.1 -w .whl
[ -f "$WHEEL" ] || { echo "build_wheels: expected $WHEEL (a pure-Python wheel)" >&2; exit 1; }
echo "build_wheels: built $WHEEL ($(du -k "$WHEEL" | cut -f1) KiB)"
