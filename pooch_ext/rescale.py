"""Rescale a recorded GraphTrace to another batch size and input size, without running it.

Every tensor shape is re-derived from the new network-input shapes by per-function shape
rules (Chainer's own output-size formula ``chainer.utils.conv.get_conv_outsize`` for
convolution and pooling), in execution order; the graph itself (ops, tensor ids, retention,
backward order) does not depend on the sizes. A function without a rule is an error, never
a guess. ``rescale_trace`` first replays the rules at the recorded sizes and checks that they
reproduce the recorded shapes, so a wrong rule cannot pass silently.

Global pooling: a pooling whose window equals its input's spatial size (padding 0, output 1
everywhere) is a global pooling; the networks compute that window from the input shape
(``pooch_ext.models._common.global_average_pool``), so at another size it stays global.
"""
from __future__ import annotations

import copy
import math
from typing import Callable

from chainer.utils.conv import get_conv_outsize

from pooch_ext.errors import PoochError
from pooch_ext.hooks.graph import GraphTrace, OpRecord

Shape = tuple[int, ...]


class ShapeRuleError(PoochError):
    """An op has no shape rule, or its rule cannot produce a valid shape at the new size."""


def _where(op: OpRecord) -> str:
    return f"op {op.index} ({op.name}{' at ' + op.label if op.label else ''})"


def _spatial_out(op: OpRecord, dims: Shape, ksize: Shape, stride: Shape, pad: Shape,
                 cover_all: bool, dilate: Shape | None = None) -> Shape:
    dilate = dilate or (1,) * len(dims)
    out = tuple(get_conv_outsize(d, k, s, p, cover_all=cover_all, d=di)
                for d, k, s, p, di in zip(dims, ksize, stride, pad, dilate))
    if any(o <= 0 for o in out):
        raise ShapeRuleError(f"{_where(op)}: input {dims} is too small for window {ksize}, "
                             f"stride {stride}, pad {pad} (output {out})")
    return out


def _conv2d(op: OpRecord, ins: list[Shape], attrs: dict) -> tuple[list[Shape], dict]:
    x, w = ins[0], op.params[0][0]
    _check_channels(op, x[1], w[1] * attrs.get("groups", 1))
    out = _spatial_out(op, x[2:], w[2:], (attrs["sy"], attrs["sx"]), (attrs["ph"], attrs["pw"]),
                       attrs["cover_all"], (attrs["dy"], attrs["dx"]))
    return [(x[0], w[0]) + out], attrs


def _conv_nd(op: OpRecord, ins: list[Shape], attrs: dict) -> tuple[list[Shape], dict]:
    x, w = ins[0], op.params[0][0]
    _check_channels(op, x[1], w[1] * attrs.get("groups", 1))
    out = _spatial_out(op, x[2:], w[2:], attrs["stride"], attrs["pad"], attrs["cover_all"],
                       attrs["dilate"])
    return [(x[0], w[0]) + out], attrs


def _check_channels(op: OpRecord, got: int, want: int) -> None:
    if got != want:
        raise ShapeRuleError(f"{_where(op)}: input has {got} channels, the weights expect {want}")


def _is_global(dims: Shape, ksize: Shape, pad: Shape, out: Shape) -> bool:
    return tuple(ksize) == tuple(dims) and not any(pad) and all(o == 1 for o in out)


def _pool_nd(op: OpRecord, ins: list[Shape], attrs: dict, recorded_in: Shape,
             recorded_out: Shape) -> tuple[list[Shape], dict]:
    x = ins[0]
    if _is_global(recorded_in[2:], attrs["ksize"], attrs["pad"], recorded_out[2:]):
        attrs = dict(attrs, ksize=tuple(x[2:]))
    out = _spatial_out(op, x[2:], attrs["ksize"], attrs["stride"], attrs["pad"], attrs["cover_all"])
    return [x[:2] + out], attrs


def _pool_2d(op: OpRecord, ins: list[Shape], attrs: dict, recorded_in: Shape,
             recorded_out: Shape) -> tuple[list[Shape], dict]:
    x = ins[0]
    if _is_global(recorded_in[2:], (attrs["kh"], attrs["kw"]), (attrs["ph"], attrs["pw"]),
                  recorded_out[2:]):
        attrs = dict(attrs, kh=x[2], kw=x[3])
    out = _spatial_out(op, x[2:], (attrs["kh"], attrs["kw"]), (attrs["sy"], attrs["sx"]),
                       (attrs["ph"], attrs["pw"]), attrs["cover_all"])
    return [x[:2] + out], attrs


def _same_as_first(op: OpRecord, ins: list[Shape], attrs: dict) -> tuple[list[Shape], dict]:
    if any(shape != ins[0] for shape in ins[1:]):
        raise ShapeRuleError(f"{_where(op)}: inputs of different shapes {ins}")
    return [ins[0]], attrs


def _concat(op: OpRecord, ins: list[Shape], attrs: dict) -> tuple[list[Shape], dict]:
    axis = attrs["axis"] % len(ins[0])
    rest = [s[:axis] + s[axis + 1:] for s in ins]
    if any(r != rest[0] for r in rest):
        raise ShapeRuleError(f"{_where(op)}: inputs {ins} do not agree off axis {axis}")
    return [ins[0][:axis] + (sum(s[axis] for s in ins),) + ins[0][axis + 1:]], attrs


def _reshape(op: OpRecord, ins: list[Shape], attrs: dict, recorded_in: Shape,
             recorded_out: Shape) -> tuple[list[Shape], dict]:
    """Only the batch-preserving flatten (N, ...) -> (N, -1) networks use before a Linear."""
    if not (len(recorded_out) == 2 and recorded_out[0] == recorded_in[0]):
        raise ShapeRuleError(f"{_where(op)}: no shape rule for reshape {recorded_in} -> "
                             f"{recorded_out} (only the flatten (N, ...) -> (N, -1) is known)")
    x = ins[0]
    out = (x[0], math.prod(x[1:]))
    return [out], dict(attrs, shape=(x[0], -1))


def _linear(op: OpRecord, ins: list[Shape], attrs: dict) -> tuple[list[Shape], dict]:
    x, w = ins[0], op.params[0][0]
    if len(x) != 2 or x[1] != w[1]:
        raise ShapeRuleError(f"{_where(op)}: the layer takes {w[1]} input features, this input "
                             f"size gives {math.prod(x[1:])} (shape {x}); the network needs "
                             "another input size")
    return [(x[0], w[0])], attrs


def _softmax_cross_entropy(op: OpRecord, ins: list[Shape], attrs: dict) -> tuple[list[Shape], dict]:
    x, t = ins
    if t[0] != x[0]:
        raise ShapeRuleError(f"{_where(op)}: {x[0]} scores but {t[0]} labels")
    return [() if attrs.get("reduce", "mean") == "mean" else t], attrs


_SIMPLE: dict[str, Callable] = {
    "Convolution2DFunction": _conv2d,
    "ConvolutionND": _conv_nd,
    "LinearFunction": _linear,
    "Concat": _concat,
    "SoftmaxCrossEntropy": _softmax_cross_entropy,
    **{name: _same_as_first for name in (
        "ReLU", "BatchNormalization", "FixedBatchNormalization", "Dropout", "Add",
        "LocalResponseNormalization", "Sigmoid", "Tanh", "LeakyReLU")},
}
_NEEDS_RECORDED: dict[str, Callable] = {   # rules that look at the recorded shapes too
    "MaxPoolingND": _pool_nd,
    "AveragePoolingND": _pool_nd,
    "MaxPooling2D": _pool_2d,
    "AveragePooling2D": _pool_2d,
    "Reshape": _reshape,
}
KNOWN_FUNCTIONS = frozenset(_SIMPLE) | frozenset(_NEEDS_RECORDED)


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
        if op.name in _SIMPLE:
            new_outs, attrs = _SIMPLE[op.name](op, ins, dict(op.attrs))
        elif op.name in _NEEDS_RECORDED:
            new_outs, attrs = _NEEDS_RECORDED[op.name](
                op, ins, dict(op.attrs), trace.tensors[op.inputs[0]].shape,
                trace.tensors[op.outputs[0]].shape)
        else:
            raise ShapeRuleError(f"{_where(op)}: no shape rule for Chainer function {op.name!r}; "
                                 f"known: {', '.join(sorted(KNOWN_FUNCTIONS))}")
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
