"""What Chainer's function nodes tell, read without changing them: the tag a recorder puts
on the nodes of its iteration, the forward ops a set of tensors depends on, how many ops a
backward pass from a loss will visit, a function's scalar attributes, the arrays it keeps
for its backward, and whether it is a static subgraph PoocH cannot see into; and what the
hooks after PoocH's are handed of a node's inputs."""
from __future__ import annotations

from typing import Any

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer

TAG = "_pooch_tag"   # attribute set on VariableNodes / FunctionNodes: (recording serial, index)
SPENT = "_pooch_spent"   # set on a FunctionNode whose kept arrays went when its iteration ended
HANDED = "_pooch_handed"   # on a FunctionNode during its backward: inputs handed to the hooks


def scalar_attrs(function: Any) -> dict[str, Any]:
    """The function's public plain attributes (stride, pad, axis, ...): what the cost model
    and the shape rules read (``OpRecord.attrs``)."""
    def plain(value: Any) -> bool:
        if isinstance(value, (bool, int, float, str)) or value is None:
            return True
        return isinstance(value, tuple) and all(isinstance(v, (bool, int, float)) for v in value)

    return {k: v for k, v in vars(function).items()
            if not k.startswith("_") and k not in ("rank", "inputs", "outputs", "stack", "lazy_grad_sum")
            and plain(v)}


def node_state(function: Any, exclude: set[int], adapted: bool = False
               ) -> list[tuple[Any, str, Any]]:
    """(owner, attribute, array) of each array the function node keeps for its backward
    beyond ``exclude`` (ids of base arrays: its inputs', outputs', the model's): pooling
    argmax, BatchNormalization statistics, a softmax. ``adapted``: for an old-style
    ``chainer.Function`` (BatchRenormalization's, a user's) also what that Function keeps
    on itself, its output included (the owner: the node, or the Function it adapts), which
    an ended graph lets go of; the profile measures those as the op's own memory instead
    (counted as kept by the node, the model fell 12 KB short at BatchRenormalization's
    forward). One entry per base array; adds to ``exclude``."""
    from pooch_ext.hooks.model_state import base_of, is_array

    kept = []
    inner = function.function if adapted and \
        isinstance(function, chainer.function.FunctionAdapter) else None
    for owner in [function] + ([inner] if inner is not None else []):
        for name, value in vars(owner).items():
            if name in ("inputs", "outputs") or not is_array(value):
                continue
            base = base_of(value)
            if id(base) not in exclude:
                exclude.add(id(base))
                kept.append((owner, name, base))
    return kept


def saved_inputs(function: Any) -> list[Any]:
    """The VariableNodes of the inputs ``function`` retained for its backward that hold an
    array a graph that ended may drop: one no Variable holds any more (the batch a loop
    passed as an array, say), which only the graph keeps alive, and one a Variable still
    holds (the Variable keeps its own reference; the node's would keep the array alive once
    the Variable goes while the loop keeps the graph: a model's ``self.mid = h`` beside a
    loop's ``loss = y``, 128 KB held through the next backward, 2.9% over a user's budget).
    A parameter's node is left."""
    from pooch_ext.hooks.chainer_refs import retained_indexes

    inputs, _ = retained_indexes(function)
    return _droppable(function.inputs[i] for i in inputs)


def saved_outputs(function: Any) -> list[Any]:
    """As ``saved_inputs``, of the outputs ``function`` retained (a map a later backward
    pass had back)."""
    from pooch_ext.hooks.chainer_refs import retained_indexes

    _, outputs = retained_indexes(function)
    return _droppable(function.outputs[i]() for i in outputs)


def _droppable(nodes: Any) -> list[Any]:
    """Those of ``nodes`` (VariableNodes, None for one gone) holding an array, but not a
    parameter's."""
    from pooch_ext.hooks.chainer_refs import node_array

    return [node for node in nodes if node is not None and node_array(node) is not None
            and not isinstance(node.get_variable_or_none(), chainer.Parameter)]


def misses_saved(function: Any) -> bool:
    """Whether the node lacks an array its backward reads: a retained input or output PoocH
    freed after that backward ran, or what it kept besides (``SPENT``). Chainer never drops
    them itself, so a node of an ended iteration that misses one cannot run backward again."""
    from pooch_ext.hooks.chainer_refs import node_array, retained_indexes, retained_outputs

    if getattr(function, SPENT, False):
        return True
    if function.inputs is None:     # its forward raised or ran without a graph: no backward
        return False
    inputs, outputs = retained_indexes(function)
    if any(node_array(function.inputs[i]) is None for i in inputs):
        return True
    data = retained_outputs(function)
    return bool(outputs) and (data is None or any(array is None for array in data))


def is_static_graph(function: Any) -> bool:
    """Chainer's static subgraph optimisation (``@chainer.static_graph``): its first call
    records a schedule while running the ops; later calls are one opaque function."""
    return type(function).__name__ == "StaticScheduleFunction" or \
        getattr(chainer.config, "schedule_func", None) is not None


def count_backward_ops(loss_creator: Any, serial: object) -> int:
    """How many recorded functions Chainer's backward will visit from ``loss_creator``, for
    a pass begun outside the wrapped entry points (``from chainer import grad`` before
    PoocH): it follows inputs that require grad (chainer._backprop._backprop_to_all). A
    function returning no gradient for such an input makes Chainer visit fewer; then
    on_backward_complete is not called for that pass."""
    seen, frontier, count = {id(loss_creator)}, [loss_creator], 0
    while frontier:
        function = frontier.pop()
        tag = getattr(function, TAG, None)
        grad_inputs = [node for node in function.inputs if node.requires_grad]
        if tag is not None and tag[0] is serial and tag[1] >= 0 and grad_inputs:
            count += 1
        for node in grad_inputs:
            creator = node.creator_node
            if creator is not None and id(creator) not in seen:
                seen.add(id(creator))
                frontier.append(creator)
    return count


def ancestors(nodes: list, serial: object) -> set[int]:
    """Forward ops of the recording ``serial`` that the tensors ``nodes`` depend on."""
    found: set[int] = set()
    frontier = [n.creator_node for n in nodes if n.creator_node is not None]
    seen = {id(f) for f in frontier}
    while frontier:
        function = frontier.pop()
        tag = getattr(function, TAG, None)
        if tag is not None and tag[0] is serial and tag[1] >= 0:
            found.add(tag[1])
        for node in function.inputs:
            creator = node.creator_node
            if creator is not None and id(creator) not in seen:
                seen.add(id(creator))
                frontier.append(creator)
    return found


def hand_back_inputs(function: Any) -> None:
    """The arrays PoocH brought back for ``function``'s backward (swapped, recomputed) go
    into what Chainer hands the hooks after PoocH's before that backward, as plain Chainer
    hands them (a user's K-FAC hook got None for a swapped input in every iteration that ran
    on demand, and failed on ``x.T``). Only where another hook reads them: Chainer's list
    holds them until its loop moves on (``take_back_inputs``)."""
    from pooch_ext.hooks.chainer_refs import has_other_hooks, hooks_in_data, node_array

    if not has_other_hooks(function):
        return
    in_data = hooks_in_data(function)
    if in_data is None:
        return
    handed = [k for k, array in enumerate(in_data) if array is None
              and node_array(function.inputs[k]) is not None]
    for k in handed:
        in_data[k] = node_array(function.inputs[k])
    if handed:
        setattr(function, HANDED, handed)


def take_back_inputs(function: Any) -> None:
    """After ``function``'s backward, before PoocH frees or swaps anything: what
    ``hand_back_inputs`` handed goes out of Chainer's list again (it would hold a map the
    plan frees there until the next op: more memory than planned), so the hooks after
    PoocH's see None there after the backward, as for any input the op does not retain."""
    from pooch_ext.hooks.chainer_refs import hooks_in_data

    handed = function.__dict__.pop(HANDED, None)
    in_data = hooks_in_data(function) if handed else None
    for k in handed if in_data is not None else ():
        in_data[k] = None
