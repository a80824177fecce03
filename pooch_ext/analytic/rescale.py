"""Rescale a recorded GraphTrace to another batch size and input size, without running it.

Every tensor shape is re-derived from the new network-input shapes by per-function shape
rules (``pooch_ext.functions``, implemented in ``analytic/shapes.py``), in execution order;
the graph itself (ops, tensor ids, retention, backward order) does not depend on the sizes. A
function without a rule is an error, never a guess. ``rescale_trace`` first replays the rules
at the recorded sizes and checks that they reproduce the recorded shapes, so a wrong rule
cannot pass silently.

Global pooling: a pooling whose window equals its input's spatial size (padding 0, output 1
everywhere) is a global pooling; the networks compute that window from the input shape
(``pooch_ext.models._common.global_average_pool``), so at another size it stays global.
"""
from __future__ import annotations

import copy

from pooch_ext.functions import shape_rule
from pooch_ext.trace import GraphTrace
from pooch_ext.analytic.shapes import Shape, ShapeRuleError, where as _where

__all__ = ["ShapeRuleError", "rescale_trace"]


def _apply(trace: GraphTrace, input_shapes: dict[int, Shape]) -> GraphTrace:
    """Shapes of every tensor (and updated attributes) for new network-input shapes."""
    out = copy.deepcopy(trace)
    shapes: dict[int, Shape] = {}
    for tid, shape in input_shapes.items():
        shapes[tid] = tuple(int(s) for s in shape)
    for op in out.ops:
        ins = []
        for tid in op.inputs:
            if tid not in shapes:
                record = trace.tensors[tid]
                if record.producer >= 0:
                    raise ShapeRuleError(f"{_where(op)}: input tensor {tid} has no shape yet")
                raise ShapeRuleError(f"network input {tid} (shape {record.shape}) was given no "
                                     "new shape")
            ins.append(shapes[tid])
        rule = shape_rule(op.name, _where(op))
        recorded_in = trace.tensors[op.inputs[0]].shape if op.inputs else ()
        new_outs, attrs = rule(op, ins, dict(op.attrs), recorded_in,
                               trace.tensors[op.outputs[0]].shape)
        if len(new_outs) != len(op.outputs):
            raise ShapeRuleError(f"{_where(op)}: rule gave {len(new_outs)} outputs, "
                                 f"the op has {len(op.outputs)}")
        op.attrs = attrs
        for tid, shape in zip(op.outputs, new_outs):
            shapes[tid] = tuple(int(s) for s in shape)
    for record in out.tensors:
        if record.tid in shapes:
            record.shape = shapes[record.tid]
    return out


def rescale_trace(trace: GraphTrace, input_shapes: dict[int, Shape]) -> GraphTrace:
    """A copy of ``trace`` whose tensors have the shapes the new network inputs give.

    ``input_shapes`` maps each network-input tensor id (producer -1) to its new full shape
    (batch included). The rules are first checked against the recorded shapes.
    """
    recorded = {t.tid: t.shape for t in trace.tensors if t.producer < 0}
    replay = _apply(trace, recorded)
    for ours, theirs in zip(replay.tensors, trace.tensors):
        if theirs.dtype and ours.shape != theirs.shape:   # dtype "": an output nobody kept
            producer = trace.ops[theirs.producer]
            raise ShapeRuleError(f"{_where(producer)}: shape rule gives {ours.shape} at the "
                                 f"recorded size, Chainer gave {theirs.shape}")
    unknown = set(input_shapes) - set(recorded)
    if unknown:
        raise ShapeRuleError(f"tensors {sorted(unknown)} are not network inputs")
    return _apply(trace, {**recorded, **input_shapes})
