"""Partial views the graph retains: a map that views part of a larger array keeps all of
it alive (NumPy and CuPy free a buffer only when every view of it is gone), which no
profile counts, since each map is charged its own bytes. Chainer's NStepLSTM splits its
carried state when sequences end and the step's LSTM and Linear nodes retain the first
part: 218112 bytes pinned beyond the views' own on a tagger of 32 sequences, whose plans
overran the budget by 2.7% (experiments/diagnose_views.py). A strided slice pins its base the
same way: a channel slice ``h[:, :4]`` that a Mul retains kept all of ``h`` after the plan
had swapped ``h`` out, 2.7-4% over the budget in every planned iteration of a user trial's
gated CNN. The executor gives such a node a dense copy instead, in the order its axes lie
(what a swap round trip gives it on the CPU device: hooks/cpu_device.layout_view), so the
rest of the larger array goes with its other holders, as the profile has it."""
from __future__ import annotations

from typing import Any, Callable

from pooch_ext.hooks.chainer_refs import node_array, set_node_array
from pooch_ext.hooks.model_state import base_of


def compact(node: Any, owned: Callable[[int], bool]) -> bool:
    """Give ``node`` (a retained input's VariableNode) a dense copy of its array where that
    is a view of part of a larger array that is not ``owned`` (``owned(id(base))``: the
    caller's input batch or the model's, held anyway); whether it did. The copy keeps the
    order of the axes in memory (``order="K"``): a dense view's copy has its very strides,
    a strided slice's is the dense block a swap brings back, read by every plan that swaps
    the map (the profiling iterations' swap-all among them) on the CPU device."""
    array = None if node is None else node_array(node)
    if array is None or getattr(array, "base", None) is None:
        return False
    base = base_of(array)
    if int(base.nbytes) <= int(array.nbytes) or owned(id(base)):
        return False
    set_node_array(node, array.copy(order="K"))
    return True
