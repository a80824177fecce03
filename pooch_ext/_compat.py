"""Let chainer 7.8.1 import on today's Python / NumPy, patching no more than it must.

chainer 7.8.1 (2020) trips over two things when it is imported:

* ``np.sctypes`` (read by ``chainer.functions.array.as_strided`` at import) was removed in
  NumPy 2. We put back the same table NumPy 1.26 had, and only when it is missing.
* ``chainer._environment_check`` imports ``numpy.distutils`` (removed in NumPy 2 and on
  Python >= 3.12, deprecated since NumPy 1.23) and ``pkg_resources`` (removed in setuptools
  81, deprecated before), only to warn about macOS BLAS and optional-package versions. On
  every stack we support one of the two is missing or warns on import, so we register a
  silent stand-in for that one module before chainer imports it.

Nothing else in chainer is touched.
"""
from __future__ import annotations

import sys
import types

import numpy as np


def _restore_sctypes() -> None:
    if "sctypes" in vars(np) or np.__version__.startswith("1."):
        return
    np.sctypes = {  # type: ignore[attr-defined]
        "int": [np.int8, np.int16, np.int32, np.int64],
        "uint": [np.uint8, np.uint16, np.uint32, np.uint64],
        "float": [np.float16, np.float32, np.float64, np.longdouble],
        "complex": [np.complex64, np.complex128, np.clongdouble],
        "others": [bool, object, bytes, str, np.void],
    }


def _silent_environment_check() -> types.ModuleType:
    module = types.ModuleType("chainer._environment_check")
    module.__doc__ = ("Stand-in from pooch_ext._compat: the original imports numpy.distutils "
                      "and pkg_resources only to print warnings.")
    module.check = lambda: None  # type: ignore[attr-defined]
    return module


def ensure_chainer_importable() -> None:
    """Apply both patches; call before the first ``import chainer`` (pooch_ext does)."""
    _restore_sctypes()
    if "chainer" not in sys.modules:
        sys.modules.setdefault("chainer._environment_check", _silent_environment_check())
