"""Split convolutions in the cost model (issue 14): the configurations a convolution can run
in (hooks/split_conv.py and hooks/split_conv_nd.py run them) and what each costs, for
analytic profiles; ``nested_pieces`` is the one rule of how a piece count spreads over a
part's loops, for the runtime and the cost model alike.

A configuration is ``(pieces, transient_bytes, seconds)``. A 2D convolution's forward op runs
its batch in ``pieces`` (each piece builds its own column buffer); its backward op runs its
input gradient over the batch (at most one piece per sample) and its weight gradient over
input channels, then output channels. An N-D convolution (grouped or not) also splits a batch
of one: its forward over the batch, then output rows (the first spatial dimension); its input
gradient over the batch, then channel units (channels, or groups); its weight gradient over
channel units, then the kernel's offsets in the first dimension, then output channels.
``pieces`` 1 is the op as Chainer runs it (the profile's own row).

Memory: a piece's scratch is the whole scratch in proportion to its share (the largest
piece), as conv() in costmodel.py charges the whole; the weight gradient's copy of gy
shrinks only with output-channel pieces.

Time: smaller GEMMs run at lower efficiency, so pieces are not free. The curve: a GEMM of
F FLOPs reaches ``F / (F + H)`` of the efficiency a GEMM of unbounded size would, with
``H = GEMM_HALF_S * peak FLOP/s`` (a GEMM whose work would take 5 microseconds at peak runs
at half efficiency: on a V100, 7e7 FLOPs, about a 330^3 SGEMM, in line with cuBLAS SGEMM
at that size). The whole op's calibrated time (costmodel.GPU.time_s) is taken as the
curve's value at its own size, so a piece of F/p FLOPs takes ``(F/p + H) * F / (F + H)``
at the calibrated rate, its share of the bytes moved (plus a weight read), and one more
launch per kernel. A split is therefore always slower than whole on the cost model; on the
CPU device measured configurations can be faster (issue 14's measurement).
"""
from __future__ import annotations

import math

from pooch_ext.analytic.costmodel import (COMPUTE_EFFICIENCY, MEMORY_EFFICIENCY, GPU, OpCost,
                                          OpShapes, column_bytes)

Config = tuple[int, int, float]       # (pieces, transient bytes, seconds)
GEMM_HALF_S = 5e-6                    # the curve's half-efficiency work, in seconds at peak
MAX_PIECES = 1024                     # beyond this the launches alone outweigh any gain
SPLITTABLE = ("Convolution2DFunction", "ConvolutionND")   # what hooks/split_conv*.py run


def splittable(op: OpShapes) -> bool:
    """Whether the runtime can split ``op`` on the im2col path: an ungrouped 2D convolution
    of a batch over one sample (hooks/split_conv.py), or an N-D convolution, grouped or not,
    without ``cover_all`` (hooks/split_conv_nd.py, also over its output's first dimension)."""
    if op.conv_impl != "im2col" or op.name not in SPLITTABLE:
        return False
    if op.name == "ConvolutionND":
        return not op.attrs.get("cover_all", False) and op.inputs[0][0] * op.outputs[0][2] > 1
    return int(op.attrs.get("groups", 1) or 1) == 1 and op.inputs[0][0] > 1


def piece_counts(n: int, factor: int = 2) -> list[int]:
    """The piece counts offered for ``n`` items: 2, then each ``factor`` times the one
    before while pieces stay distinct, then ``n`` itself (one item each). Measuring on a
    device takes every fourth power of two (hooks/conv_configs.py)."""
    counts, p = [], 2
    while p < n and p <= MAX_PIECES:
        counts.append(p)
        p *= factor
    if n <= MAX_PIECES:
        counts.append(n)
    return counts


def nested_pieces(pieces: int, *sizes: int) -> tuple[int, ...]:
    """``pieces`` spread over nested loops of ``sizes`` items, outermost first: the first
    loop takes as many as it has items, each next one the rest of the factor (rounded up),
    at most its own items. hooks/split_conv_nd.py runs an N-D convolution's parts so: the
    forward over (batch, output rows), the input gradient over (batch, channel units), the
    weight gradient over (channel units, first-dimension kernel offsets, output channels)."""
    out, done = [], 1
    for size in sizes:
        count = max(1, min(-(-pieces // done), size))
        out.append(count)
        done *= count
    return tuple(out)


def nd_loops(groups: int, x_shape: tuple, y_shape: tuple, w_shape: tuple
             ) -> dict[str, tuple[int, int] | tuple[int, int, int]]:
    """The loops each part of an N-D convolution splits over, outermost first (the items of
    ``nested_pieces``; hooks/split_conv_nd.py runs them so): the forward over (batch, output
    rows), the input gradient over (batch, channel units), the weight gradient over (channel
    units, first-dimension kernel offsets, output channels). Channel units are the groups of
    a grouped convolution (each group's GEMM stays Chainer's own), else single channels, and
    a grouped weight gradient does not split its output channels."""
    batch, c_in, c_out = int(x_shape[0]), int(x_shape[1]), int(y_shape[1])
    units = groups if groups > 1 else c_in
    return {"forward": (batch, int(y_shape[2])), "input_grad": (batch, units),
            "weight_grad": (units, int(w_shape[2]), 1 if groups > 1 else c_out)}


def most_pieces(nd: bool, x_shape: tuple, y_shape: tuple, w_shape: tuple, groups: int = 1,
                wants_gx: bool = True) -> tuple[int, int]:
    """(forward, backward) piece counts a convolution can use (one item a piece in every
    loop): what the cost model offers and hooks/conv_configs.py measures up to."""
    batch, c_in, c_out = int(x_shape[0]), int(x_shape[1]), int(y_shape[1])
    if not nd:
        return batch, max(batch, c_in * c_out)
    loops = nd_loops(groups, x_shape, y_shape, w_shape)
    return (math.prod(loops["forward"]),
            max(math.prod(loops["input_grad"]) if wants_gx else 1,
                math.prod(loops["weight_grad"])))


def piece_time(gpu: GPU, flops: float, nbytes: float, pieces: int, kernels: int,
               extra_bytes: float = 0.0) -> float:
    """Seconds for an op of ``flops`` and ``nbytes`` run in ``pieces`` equal pieces of
    ``kernels`` launches each, ``extra_bytes`` read again per piece (the curve above)."""
    if pieces == 1:
        return gpu.time_s(flops, nbytes)
    half = gpu.peak_flops * GEMM_HALF_S
    share = flops / pieces
    compute = (share + half) * flops / (flops + half) / (gpu.peak_flops * COMPUTE_EFFICIENCY)
    memory = (nbytes / pieces + extra_bytes) / (gpu.mem_bytes_per_s * MEMORY_EFFICIENCY)
    return pieces * (max(compute, memory) + kernels * gpu.launch_latency_s)


def conv_configs(op: OpShapes, cost: OpCost, gpu: GPU) -> tuple[list[Config], list[Config]]:
    """(forward configurations, backward configurations) other than whole; both empty when
    the runtime cannot split ``op``."""
    if not splittable(op):
        return [], []
    if op.name == "ConvolutionND":
        return _nd_configs(op, cost, gpu)
    x, y, w = op.inputs[0], op.outputs[0], op.params[0]
    s = op.itemsize
    batch, c_in = int(x[0]), int(x[1])
    col = column_bytes(x, y, w, s)
    y_b, w_b = math.prod(y) * s, math.prod(w) * s
    x_b = math.prod(x) * s
    wants_gx = 0 in op.differentiable
    most_forward, most_backward = most_pieces(False, x, y, w)
    forward = []
    for pieces in piece_counts(most_forward):
        share = _share(batch, pieces)                      # the largest piece's share
        copies = 2 if math.ceil(batch / pieces) > 1 else 1
        forward.append((pieces, int(col * share * copies + y_b * share),
                        piece_time(gpu, cost.fwd_flops, cost.fwd_bytes, pieces, 2, w_b)))
    backward = []
    c_out = int(y[1])
    for pieces in piece_counts(most_backward):
        share = _share(batch, min(pieces, batch))
        in_pieces, out_pieces = nested_pieces(pieces, c_in, c_out)
        grad_w = int(col * math.ceil(c_in / in_pieces) / c_in * 2
                     + y_b * math.ceil(c_out / out_pieces) / c_out)
        grad_x = int((col + y_b + x_b) * share) if wants_gx else 0
        # each input-channel piece copies (its slices of) all of gy again
        again = w_b + (2 * y_b if in_pieces > 1 else 0)
        backward.append((pieces, max(grad_w, grad_x),
                         piece_time(gpu, cost.bwd_flops, cost.bwd_bytes, pieces,
                                    4 if wants_gx else 2, again)))
    return forward, backward


def _share(size: int, pieces: int) -> float:
    """The largest of ``pieces`` even pieces of ``size`` items, as a share of the whole."""
    return math.ceil(size / pieces) / size


def _nd_configs(op: OpShapes, cost: OpCost, gpu: GPU) -> tuple[list[Config], list[Config]]:
    """conv_configs of an N-D convolution (hooks/split_conv_nd.py's loops, ``nested_pieces``):
    each piece runs Chainer's own core on its slice, so its scratch is the whole's in
    proportion (the column buffer's GEMM-layout copy only where a piece holds more than one
    sample), plus its output slice before it is copied into place."""
    x, y, w = op.inputs[0], op.outputs[0], op.params[0]
    s, groups = op.itemsize, int(op.attrs.get("groups", 1) or 1)
    batch, rows, k0 = int(x[0]), int(y[2]), int(w[2])
    col = column_bytes(x, y, w, s)
    x_b, y_b, w_b = math.prod(x) * s, math.prod(y) * s, math.prod(w) * s
    wants_gx = 0 in op.differentiable
    loops = nd_loops(groups, x, y, w)
    units, outs = loops["weight_grad"][0], loops["weight_grad"][2]
    forward, seen = [], {(1, 1)}
    most_forward, most_backward = most_pieces(True, x, y, w, groups, wants_gx)
    for pieces in piece_counts(most_forward):
        b, r = nested_pieces(pieces, *loops["forward"])
        if (b, r) in seen:
            continue
        seen.add((b, r))
        share = _share(batch, b) * _share(rows, r)
        copies = 2 if math.ceil(batch / b) > 1 else 1
        forward.append((pieces, int(col * share * copies + y_b * share),
                        piece_time(gpu, cost.fwd_flops, cost.fwd_bytes, b * r, 2, w_b)))
    backward, seen_b = [], {((1, 1), (1, 1, 1))}
    gy_copy = y_b if batch > 1 else 0
    for pieces in piece_counts(most_backward):
        bx, ux = nested_pieces(pieces, *loops["input_grad"]) if wants_gx else (1, 1)
        uw, kw, ow = nested_pieces(pieces, *loops["weight_grad"])
        if ((bx, ux), (uw, kw, ow)) in seen_b:
            continue
        seen_b.add(((bx, ux), (uw, kw, ow)))
        share_x = _share(batch, bx) * _share(units, ux)
        grad_x = int((col + x_b) * share_x + gy_copy * _share(batch, bx)) if wants_gx else 0
        share_w = _share(units, uw) * _share(k0, kw)
        grad_w = int(col * share_w * (2 if batch > 1 else 1) + gy_copy * _share(outs, ow)
                     + (x_b * _share(units, uw) if kw > 1 else 0))   # the cropped input
        again = w_b + (2 * y_b if uw * kw > 1 else 0)
        backward.append((pieces, max(grad_w, grad_x),
                         piece_time(gpu, cost.bwd_flops, cost.bwd_bytes,
                                    max(bx * ux, uw * kw * ow), 4 if wants_gx else 2, again)))
    return forward, backward
