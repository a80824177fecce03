"""Backward passes as events: Chainer has no hook for "a backward pass begins / ends", and the
end of the first pass is the last moment before the optimizer's update (where a budget must be
refused). While a recorder is entered, the three entry points of a backward pass are wrapped
(and put back when the last recorder exits): Variable.backward and chainer.backward both run
``_backprop._backprop_to_all``; chainer.grad runs its own loop. A pass begun through a
reference taken before the wrapping goes unsignalled (hooks/graph.py predicts its end).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer

from pooch_ext.hooks.chainer_refs import backprop_patch_point, wrap_backprop

_LISTENERS: list[Any] = []          # the entered recorders (hooks/graph.py)
_ORIGINALS: list[tuple[Any, str, Any]] = []


@contextmanager
def _backward_pass(nodes: list, double: bool, returned: bool = False) -> Iterator[None]:
    """``returned``: the pass hands its gradients back (``chainer.grad``) rather than
    leaving them on Variables."""
    listeners = list(_LISTENERS)
    for recorder in listeners:
        recorder._pass_begin(nodes, double, returned)
    failed = True
    try:
        yield
        failed = False
    finally:
        for recorder in listeners:
            recorder._pass_end(failed)


def _signalled_backprop_to_all(original: Callable) -> Callable:
    def backprop_to_all(outputs, retain_grad, loss_scale):
        # callers set enable_backprop to their enable_double_backprop around this call
        with _backward_pass([y for y, _ in outputs], bool(chainer.config.enable_backprop)):
            return original(outputs, retain_grad, loss_scale)
    return backprop_to_all


def _signalled_grad(original: Callable) -> Callable:
    def grad(outputs, inputs, *args, **kwargs):
        double = kwargs.get("enable_double_backprop", args[4] if len(args) > 4 else False)
        try:
            nodes = [v.node for v in outputs]
        except (AttributeError, TypeError):     # bad arguments: chainer's own error follows
            return original(outputs, inputs, *args, **kwargs)
        with _backward_pass(nodes, bool(double), returned=True):
            return original(outputs, inputs, *args, **kwargs)
    grad.__doc__ = original.__doc__
    return grad


def listen(recorder: Any) -> None:
    """Tell ``recorder`` (its ``_pass_begin`` / ``_pass_end``) of every backward pass, and
    put its function hook (entered) first: the maps it brings back for a backward op are
    there for the hooks a user entered before PoocH (function_nodes.hand_back_inputs)."""
    hooks = chainer.get_function_hooks()
    if hooks.get(recorder.name) is recorder:
        hooks.move_to_end(recorder.name, last=False)
    if not _LISTENERS:
        import chainer.function_node as function_node

        original_grad = function_node.grad
        wrapped_grad = _signalled_grad(original_grad)
        backprop, name = backprop_patch_point()
        _ORIGINALS[:] = [(backprop, name, getattr(backprop, name)),
                         (function_node, "grad", original_grad), (chainer, "grad", chainer.grad)]
        wrap_backprop(_signalled_backprop_to_all)
        function_node.grad = wrapped_grad
        if chainer.grad is original_grad:
            chainer.grad = wrapped_grad
    _LISTENERS.append(recorder)


def unlisten(recorder: Any) -> None:
    """Stop telling ``recorder``; the last one out puts Chainer's entry points back."""
    if recorder in _LISTENERS:
        _LISTENERS.remove(recorder)
    if not _LISTENERS:
        for owner, name, original in _ORIGINALS:
            setattr(owner, name, original)
        _ORIGINALS.clear()
