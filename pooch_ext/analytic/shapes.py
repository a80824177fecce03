"""Shape rules: the output shapes of one Chainer function from its input shapes.

A rule is ``rule(op, input_shapes, attrs, recorded_in, recorded_out) -> (output_shapes,
attrs)``: ``recorded_in`` / ``recorded_out`` are the first input's and output's shapes as the
trace recorded them (a global pooling stays global, a flatten stays a flatten), ``attrs`` the
node's scalar attributes updated for the new size. Which function uses which rule is
``pooch_ext.functions.FUNCTIONS``; ``pooch_ext.analytic.rescale`` applies them to a whole trace.
Convolution and pooling use Chainer's own ``get_conv_outsize`` (imported when first needed, so
the planning core loads without chainer).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pooch_ext.errors import PoochError

if TYPE_CHECKING:
    from pooch_ext.trace import OpRecord

Shape = tuple[int, ...]
Rule = tuple[list[Shape], dict]


class ShapeRuleError(PoochError):
    """An op has no shape rule, or its rule cannot produce a valid shape at the new size."""


def where(op: OpRecord) -> str:
    return f"op {op.index} ({op.name}{' at ' + op.label if op.label else ''})"


def _spatial_out(op: OpRecord, dims: Shape, ksize: Shape, stride: Shape, pad: Shape,
                 cover_all: bool, dilate: Shape | None = None) -> Shape:
    from chainer.utils.conv import get_conv_outsize   # Chainer's own formula, used lazily

    dilate = dilate or (1,) * len(dims)
    out = tuple(get_conv_outsize(d, k, s, p, cover_all=cover_all, d=di)
                for d, k, s, p, di in zip(dims, ksize, stride, pad, dilate))
    if any(o <= 0 for o in out):
        raise ShapeRuleError(f"{where(op)}: input {dims} is too small for window {ksize}, "
                             f"stride {stride}, pad {pad} (output {out})")
    return out


def conv2d(op: OpRecord, ins: list[Shape], attrs: dict, recorded_in: Shape,
           recorded_out: Shape) -> Rule:
    x, w = ins[0], op.params[0][0]
    _check_channels(op, x[1], w[1] * attrs.get("groups", 1))
    out = _spatial_out(op, x[2:], w[2:], (attrs["sy"], attrs["sx"]), (attrs["ph"], attrs["pw"]),
                       attrs["cover_all"], (attrs["dy"], attrs["dx"]))
    return [(x[0], w[0]) + out], attrs


def conv_nd(op: OpRecord, ins: list[Shape], attrs: dict, recorded_in: Shape,
            recorded_out: Shape) -> Rule:
    x, w = ins[0], op.params[0][0]
    _check_channels(op, x[1], w[1] * attrs.get("groups", 1))
    out = _spatial_out(op, x[2:], w[2:], attrs["stride"], attrs["pad"], attrs["cover_all"],
                       attrs["dilate"])
    return [(x[0], w[0]) + out], attrs


def _check_channels(op: OpRecord, got: int, want: int) -> None:
    if got != want:
        raise ShapeRuleError(f"{where(op)}: input has {got} channels, the weights expect {want}")


def _is_global(dims: Shape, ksize: Shape, pad: Shape, out: Shape) -> bool:
    return tuple(ksize) == tuple(dims) and not any(pad) and all(o == 1 for o in out)


def pool_nd(op: OpRecord, ins: list[Shape], attrs: dict, recorded_in: Shape,
            recorded_out: Shape) -> Rule:
    x = ins[0]
    if _is_global(recorded_in[2:], attrs["ksize"], attrs["pad"], recorded_out[2:]):
        attrs = dict(attrs, ksize=tuple(x[2:]))
    out = _spatial_out(op, x[2:], attrs["ksize"], attrs["stride"], attrs["pad"], attrs["cover_all"])
    return [x[:2] + out], attrs


def pool_2d(op: OpRecord, ins: list[Shape], attrs: dict, recorded_in: Shape,
            recorded_out: Shape) -> Rule:
    x = ins[0]
    if _is_global(recorded_in[2:], (attrs["kh"], attrs["kw"]), (attrs["ph"], attrs["pw"]),
                  recorded_out[2:]):
        attrs = dict(attrs, kh=x[2], kw=x[3])
    out = _spatial_out(op, x[2:], (attrs["kh"], attrs["kw"]), (attrs["sy"], attrs["sx"]),
                       (attrs["ph"], attrs["pw"]), attrs["cover_all"])
    return [x[:2] + out], attrs


def same_as_first(op: OpRecord, ins: list[Shape], attrs: dict, recorded_in: Shape,
                  recorded_out: Shape) -> Rule:
    if any(shape != ins[0] for shape in ins[1:]):
        raise ShapeRuleError(f"{where(op)}: inputs of different shapes {ins}")
    return [ins[0]], attrs


def concat(op: OpRecord, ins: list[Shape], attrs: dict, recorded_in: Shape,
           recorded_out: Shape) -> Rule:
    axis = attrs["axis"] % len(ins[0])
    rest = [s[:axis] + s[axis + 1:] for s in ins]
    if any(r != rest[0] for r in rest):
        raise ShapeRuleError(f"{where(op)}: inputs {ins} do not agree off axis {axis}")
    return [ins[0][:axis] + (sum(s[axis] for s in ins),) + ins[0][axis + 1:]], attrs


def reshape(op: OpRecord, ins: list[Shape], attrs: dict, recorded_in: Shape,
            recorded_out: Shape) -> Rule:
    """Only the batch-preserving flatten (N, ...) -> (N, -1) networks use before a Linear."""
    if not (len(recorded_out) == 2 and recorded_out[0] == recorded_in[0]):
        raise ShapeRuleError(f"{where(op)}: no shape rule for reshape {recorded_in} -> "
                             f"{recorded_out} (only the flatten (N, ...) -> (N, -1) is known)")
    x = ins[0]
    out = (x[0], math.prod(x[1:]))
    return [out], dict(attrs, shape=(x[0], -1))


def linear(op: OpRecord, ins: list[Shape], attrs: dict, recorded_in: Shape,
           recorded_out: Shape) -> Rule:
    x, w = ins[0], op.params[0][0]
    if len(x) != 2 or x[1] != w[1]:
        raise ShapeRuleError(f"{where(op)}: the layer takes {w[1]} input features, this input "
                             f"size gives {math.prod(x[1:])} (shape {x}); the network needs "
                             "another input size")
    return [(x[0], w[0])], attrs


def softmax_cross_entropy(op: OpRecord, ins: list[Shape], attrs: dict, recorded_in: Shape,
                          recorded_out: Shape) -> Rule:
    x, t = ins
    if t[0] != x[0]:
        raise ShapeRuleError(f"{where(op)}: {x[0]} scores but {t[0]} labels")
    return [() if attrs.get("reduce", "mean") == "mean" else t], attrs


def embed_id(op: OpRecord, ins: list[Shape], attrs: dict, recorded_in: Shape,
             recorded_out: Shape) -> Rule:
    """Each id becomes a row of the weight (vocabulary x width)."""
    return [tuple(ins[0]) + (op.params[0][0][1],)], attrs


def lstm(op: OpRecord, ins: list[Shape], attrs: dict, recorded_in: Shape,
         recorded_out: Shape) -> Rule:
    """(c_prev (N, H, ...), x (N, 4H, ...)) -> (c, h), both shaped like c_prev."""
    c, x = ins
    if x[0] != c[0] or x[1] != 4 * c[1] or x[2:] != c[2:]:
        raise ShapeRuleError(f"{where(op)}: LSTM input {x} does not match a cell of {c}")
    return [c, c], attrs


def mean(op: OpRecord, ins: list[Shape], attrs: dict, recorded_in: Shape,
         recorded_out: Shape) -> Rule:
    """A mean over ``axis`` (all axes when None), keeping them as 1 with ``keepdims``."""
    x = ins[0]
    axes = attrs.get("axis")
    axes = tuple(range(len(x))) if axes is None else tuple(a % len(x) for a in axes)
    out = tuple(1 if i in axes else d for i, d in enumerate(x) if attrs.get("keepdims")
                or i not in axes)
    reduced = math.prod(x[i] for i in axes)
    return [out], dict(attrs, multiplier=1.0 / reduced) if "multiplier" in attrs else attrs


def stack(op: OpRecord, ins: list[Shape], attrs: dict, recorded_in: Shape,
          recorded_out: Shape) -> Rule:
    """Equal shapes stacked along a new ``axis``."""
    if any(shape != ins[0] for shape in ins[1:]):
        raise ShapeRuleError(f"{where(op)}: inputs of different shapes {ins}")
    axis = attrs["axis"] % (len(ins[0]) + 1)
    return [ins[0][:axis] + (len(ins),) + ins[0][axis:]], attrs
