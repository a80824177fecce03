"""chainer 7.8.1 on today's NumPy: ``import chainer`` first works in a fresh interpreter, as do
F.resize_images and F.as_strided's backward, and numpy itself is left unchanged."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

CHAINER_FIRST = """
import sys
started_with = sorted({"numpy", "chainer", "pooch_ext"} & set(sys.modules))
import chainer
import chainer.functions as F
import numpy as np

x = chainer.Variable(np.arange(2 * 3 * 4 * 4, dtype=np.float32).reshape(2, 3, 4, 4))
y = F.resize_images(x, (6, 6))
y.grad = np.ones_like(y.array)
y.backward()
assert y.shape == (2, 3, 6, 6) and y.dtype == np.float32, y
assert F.resize_images(x, (3, 5), mode="nearest", align_corners=False).shape == (2, 3, 3, 5)
s = F.as_strided(x, (2, 3), (1, 1))
s.grad = np.ones((2, 3), np.float32)
x.cleargrad()
s.backward()
numpy_changed = [name for name in ("sctypes", "float") if name in vars(np)]

import json
import pooch_ext
from pooch_ext.analytic.tracing import analytic_profile
print(json.dumps({"started_with": started_with, "numpy_changed": numpy_changed,
                  "ops": analytic_profile("small-resnet", 2).n_ops, "grad": float(x.grad.sum())}))
"""


def run_fresh(prelude: str = "") -> dict:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(prelude) + CHAINER_FIRST],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


EXPECTED = {"numpy_changed": [], "ops": 79, "grad": 6.0}


def test_import_chainer_first_in_a_fresh_interpreter():
    # the installed pooch_ext_chainer.pth imports nothing at start-up
    assert run_fresh() == {"started_with": [], **EXPECTED}


def test_import_pooch_ext_first_without_the_pth_hook():
    prelude = """
    import sys, _pooch_ext_chainer_hook as hook
    sys.meta_path.remove(hook.ChainerFinder)   # as if the .pth were not installed
    import pooch_ext
    """
    assert run_fresh(prelude) == {"started_with": ["numpy", "pooch_ext"], **EXPECTED}
