"""The simulator's C (walk.c): the boundary walk of a search's runs (sim/fastwalk.py) and the
recompute set's lifetimes (sim/lifetimes.py), loaded on first use (pooch_ext/cbuild.py
compiles it). Both have a Python reference they equal bit for bit, used where no C
compiler is found (``failure`` says why) and wherever ``POOCH_PYTHON_WALK=1`` is set.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

from pooch_ext.cbuild import BUILD_ERRORS, compiled, failure as build_failure
from pooch_ext.sim.model import SimModel, per_search

SOURCE = Path(__file__).with_name("walk.c")
_loaded: list[Any] = []       # [the library or None] once tried
failure = ""                  # why it could not be built, if it could not

_P = ctypes.c_void_p
_I = ctypes.c_int64


def library() -> Any:
    """walk.c built and loaded, or None (no compiler here, or turned off)."""
    global failure
    if os.environ.get("POOCH_PYTHON_WALK") == "1":
        return None
    if not _loaded:
        lib = None
        try:
            lib = ctypes.CDLL(str(compiled(SOURCE, "pooch_walk", ".so", ["-ffp-contract=off"])))
            lib.walk.argtypes, lib.walk.restype = [_P], ctypes.c_int
            lib.rebuilt_parts.argtypes = [_I, *[_P] * 6, _I, *[_P] * 6]
            lib.rebuilt_parts.restype = _I
            lib.static_top.argtypes, lib.static_top.restype = [_I, _I, *[_P] * 9, _I, *[_P] * 3], None
            lib.fill.argtypes = [_I, *[_P] * 4, _I, _P, _P]
            lib.fill.restype = _I
        except BUILD_ERRORS as error:
            failure = build_failure(error)
        _loaded.append(lib)
    return _loaded[0]


def for_model(model: SimModel) -> Any:
    """``library()``, asked once per search (``per_search``): the searches call into walk.c
    tens of thousands of times, and reading the environment each time cost 2% of one."""
    return per_search(model, "walk.c", library)
