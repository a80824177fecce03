"""Gist's in-place ReLU at run time (pooch_ext/inplace.py decides where): the ReLU writes its
output over its input array, as ``numpy.maximum(x, 0, out=x)``, the same ufunc Chainer's
ReLU runs (``numpy.maximum(x, 0, dtype=x.dtype)``), so the same bits in the memory the
input held.

Writing over an array is safe only where nothing else can read it: the planner checks the
graph (no other reader, the caller lets go of it), and ``alone`` checks the array itself,
when the graph is traced and again at the op: it must own its memory (not a view) and have
no reference beyond the ones Chainer's own call makes, counted on a throwaway ReLU through
the same hook (a NumPy reference the caller kept, a view, another Variable sharing it, a
node retaining it: each adds one).
"""
from __future__ import annotations

import sys
from typing import Any

import numpy

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer
import chainer.functions as F
from chainer import backend

from pooch_ext.hooks.chainer_refs import WeaklyBound


def _references(in_data: tuple) -> tuple[int, int]:
    """(references to the op's input array, references to its base; 0 when it owns its
    memory)."""
    base = getattr(in_data[0], "base", None)
    return sys.getrefcount(in_data[0]), 0 if base is None else sys.getrefcount(base)


def _references_when_alone() -> tuple[int, int]:
    """What ``_references`` gives in a forward hook when only its Variable holds the input
    and, for a view, only the view holds its base: measured on ReLUs of other ops' outputs
    that nothing else keeps (once, at import, before any of pooch-ext's hooks runs)."""
    seen: list[tuple[int, int]] = []

    class Probe(chainer.FunctionHook):
        name = "pooch_ext_alone_probe"

        def forward_preprocess(self, function: Any, in_data: tuple) -> None:
            if type(function).__name__ == "ReLU":
                seen.append(_references(in_data))

    with chainer.using_config("enable_backprop", True), Probe():
        F.relu(F.cast(chainer.Variable(numpy.zeros(2, numpy.float64)), numpy.float32))
        F.relu(F.transpose(F.cast(chainer.Variable(numpy.zeros((2, 3))), numpy.float32)))
    (alone, _), (view, base) = seen
    return max(alone, view), base


REFERENCES_WHEN_ALONE = _references_when_alone()


def alone(in_data: tuple) -> bool:
    """Whether the op's one input array has no reference but its Variable's, and either owns
    its memory or is the one view of all of it (Chainer's CPU convolution returns its output
    with axes moved): the op may write over it."""
    if len(in_data) != 1 or in_data[0] is None:
        return False
    references, base_references = _references(in_data)   # before a local here refers to it
    most, most_base = REFERENCES_WHEN_ALONE
    if references > most or base_references > most_base:
        return False
    base = getattr(in_data[0], "base", None)
    return base is None or (getattr(base, "base", None) is None
                            and base.nbytes == in_data[0].nbytes)


def _relu_over_input(function: Any, inputs: tuple) -> tuple:
    x, = inputs
    backend.get_array_module(x).maximum(x, 0, out=x)
    function.retain_outputs((0,))
    return x,


def write_over_input(function: Any) -> None:
    """Make this one ReLU node's next forward write its output over its input."""
    function.forward = WeaklyBound(_relu_over_input, function)


def as_chainer(function: Any) -> None:
    """Undo ``write_over_input``: the node's forward is its class's again (a recomputation
    re-runs it on a fresh input)."""
    vars(function).pop("forward", None)
