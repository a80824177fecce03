"""Split convolutions in the cost model (issue 14): the configurations a convolution can run
in (hooks/split_conv.py runs them) and what each costs, for analytic profiles.

A configuration is ``(pieces, transient_bytes, seconds)``. The forward op runs its batch in
``pieces`` (each piece builds its own column buffer); the backward op runs its input gradient
over the batch (at most one piece per sample) and its weight gradient over input channels,
then output channels (``weight_pieces``). ``pieces`` 1 is the op as Chainer runs it (the
profile's own row).

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
                                          OpShapes)

Config = tuple[int, int, float]       # (pieces, transient bytes, seconds)
GEMM_HALF_S = 5e-6                    # the curve's half-efficiency work, in seconds at peak
MAX_PIECES = 1024                     # beyond this the launches alone outweigh any gain
SPLITTABLE = ("Convolution2DFunction",)   # what hooks/split_conv.py can run in pieces


def splittable(op: OpShapes) -> bool:
    """Whether the runtime can split ``op`` (an ungrouped 2D convolution on the im2col path)."""
    return (op.name in SPLITTABLE and op.conv_impl == "im2col"
            and int(op.attrs.get("groups", 1) or 1) == 1 and op.inputs[0][0] > 1)


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


def weight_pieces(pieces: int, in_channels: int, out_channels: int) -> tuple[int, int]:
    """(input-channel pieces, output-channel pieces) of a weight gradient in ``pieces``:
    input channels first (each piece's column buffer shrinks), then output channels (each
    piece's copy of gy shrinks). hooks/split_conv.py runs it so."""
    in_pieces = max(1, min(pieces, in_channels))
    return in_pieces, max(1, min(-(-pieces // in_channels), out_channels))


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
    x, y, w = op.inputs[0], op.outputs[0], op.params[0]
    s = op.itemsize
    batch, c_in = int(x[0]), int(x[1])
    col = batch * c_in * math.prod(w[2:]) * math.prod(y[2:]) * s
    y_b, w_b = math.prod(y) * s, math.prod(w) * s
    x_b = math.prod(x) * s
    wants_gx = 0 in op.differentiable
    forward = []
    for pieces in piece_counts(batch):
        share = math.ceil(batch / pieces) / batch           # the largest piece's share
        copies = 2 if math.ceil(batch / pieces) > 1 else 1
        forward.append((pieces, int(col * share * copies + y_b * share),
                        piece_time(gpu, cost.fwd_flops, cost.fwd_bytes, pieces, 2, w_b)))
    backward = []
    c_out = int(y[1])
    for pieces in piece_counts(max(batch, c_in * c_out)):
        share = math.ceil(batch / min(pieces, batch)) / batch
        in_pieces, out_pieces = weight_pieces(pieces, c_in, c_out)
        grad_w = int(col * math.ceil(c_in / in_pieces) / c_in * 2
                     + y_b * math.ceil(c_out / out_pieces) / c_out)
        grad_x = int((col + y_b + x_b) * share) if wants_gx else 0
        # each input-channel piece copies (its slices of) all of gy again
        again = w_b + (2 * y_b if in_pieces > 1 else 0)
        backward.append((pieces, max(grad_w, grad_x),
                         piece_time(gpu, cost.bwd_flops, cost.bwd_bytes, pieces,
                                    4 if wants_gx else 2, again)))
    return forward, backward
