"""The graph of an iteration that has ended, which a loop may still hold (``loss = ...``
kept until the next one, L.Classifier's ``self.loss``): what PoocH lets go of there, and the
error a backward pass over it gets."""
from __future__ import annotations

from typing import Any

from pooch_ext.errors import SpentGraphError
from pooch_ext.hooks.chainer_refs import retained_outputs, set_node_array, set_retained_outputs
from pooch_ext.hooks.function_nodes import (SPENT, misses_saved, node_state, saved_inputs,
                                             saved_outputs)


def let_go(functions: list, ran: set[int]) -> None:
    """The nodes (weak references, by forward op) whose backward ran (``ran``) drop what
    they kept for it (pooling argmax, BatchNormalization statistics, retained inputs and
    outputs but the parameters': the last batch, a map a later backward pass had back, one
    a Variable the model keeps still holds: hooks/function_nodes.saved_inputs), so the next
    forward holds none of it (measured: 1.57 MB of argmax on a
    three-convolution net at batch 32, 15% of its smallest budget; a user's CNN kept its
    last 192 KiB batch, and a budget at the first check's minimum was overrun; a user's
    small GAN kept 197 KB of generator maps into the next forward)."""
    for k, ref in enumerate(functions):
        node = ref() if k in ran else None
        if node is not None:
            for owner, name, _ in node_state(node, set(), adapted=True):
                setattr(owner, name, None)
                setattr(node, SPENT, True)
            for variable_node in saved_inputs(node) + saved_outputs(node):
                set_node_array(variable_node, None)
            kept = retained_outputs(node)
            if kept is not None and any(array is not None for array in kept):
                set_retained_outputs(node, tuple(None for _ in kept))


def refuse_stale_backward(function: Any) -> None:
    """``backward()`` reached ``function`` of an ended iteration: where it misses what PoocH
    freed, a clear error instead of Chainer's AttributeError inside the node."""
    if misses_saved(function):
        raise SpentGraphError(
            f"backward() reached {type(function).__name__} of a graph built in an earlier "
            "iteration; PoocH freed the arrays it saved for backward after that iteration's "
            "backward ran (as a plan frees every map after its last use), so under PoocH a "
            "graph runs backward only in the iteration that built it: compute the loss "
            "again for a later backward")


def guard_spent(functions: list) -> None:
    """Leaving PoocH: no hook sees a backward pass any more, so each node of the last graph
    (weak references) that misses what PoocH freed raises SpentGraphError itself should
    Chainer run its backward again (a user trial's second ``backward()`` after the block
    had failed deep inside the node: AttributeError on None, or a TypeError)."""
    for ref in functions:
        node = ref()
        if node is not None and misses_saved(node):
            node.backward = _spent_backward(type(node).__name__)


def _spent_backward(name: str) -> Any:
    def backward(*args: Any, **kwargs: Any) -> Any:
        raise SpentGraphError(
            f"backward() reached {name} of a graph built under PoocH after its block ended; "
            "PoocH freed the arrays it saved for backward after that backward ran (as a plan "
            "frees every map after its last use), so run every backward over such a graph "
            "inside the block, or compute the loss again")
    return backward
