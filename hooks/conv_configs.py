"""Measured split configurations (issue 14): what running a profiled convolution in pieces
costs on the device it was profiled on, for the measured Profile's ``configs``.

While PoocH profiles, each splittable convolution's call is noted (``ConvCall``: its
attributes and its arrays' layouts, not the arrays). Building the profile then runs the
convolution on probes of those layouts (split_conv's probes) whole and in each piece count,
exactly as the executor would (each part split only where bit-identical here), and charges
a configuration the measured difference to the whole: seconds, and scratch bytes as the
device counts its allocations (the CPU device's counting allocator; on a GPU, CuPy's pool
read by a memory hook after every allocation). Without a way to count (a CPU device whose
allocator could not be built) no configuration is offered. A part that is not exact runs
whole in the measurement too, so what the profile lists is what the executor does. The
backward's incoming gradient is probed laid out as the profiled backward received it (the
profiler notes it; C-contiguous where no backward was seen), so the exactness checks the
executor looks up are made here, not inside a budgeted op (measured: a check there held 3 MB
of probes over the demo's budget).
"""
from __future__ import annotations

import dataclasses
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable

import numpy

from chainer.functions.connection.convolution_2d import (Convolution2DFunction,
                                                         Convolution2DGradW)
from chainer.functions.connection.deconvolution_2d import Deconvolution2DFunction

from pooch_ext.analytic.splits import piece_counts
from pooch_ext.hooks import split_conv
from pooch_ext.hooks.chainer_refs import original_compute_core
from pooch_ext.hooks.device import pool_peak_hook

Layout = tuple        # (shape, strides, dtype string), split_conv._layout
MEASURED_FACTOR = 4   # piece counts measured: every fourth power of two (analytic: every one)
Config = tuple[int, int, float]


@dataclass(frozen=True)
class ConvCall:
    """One profiled convolution: its attributes and its arrays' layouts."""

    stride: tuple[int, int]
    pad: tuple[int, int]
    dilate: tuple[int, int]
    cover_all: bool
    x: Layout
    W: Layout
    b: Layout | None
    wants_gx: bool       # its input receives a gradient
    gy: Layout | None = None   # its output's gradient as backward received it (None: unseen)


def conv_call(function: Any, in_data: tuple) -> ConvCall | None:
    """The call of ``function`` on ``in_data`` if it can run split, else None."""
    if split_conv.not_splittable(function) or len(in_data) < 2 or in_data[0].shape[0] < 2:
        return None
    x, W = in_data[0], in_data[1]
    b = in_data[2] if len(in_data) > 2 else None
    node = function.inputs[0] if function.inputs else None
    wants_gx = node is None or getattr(node, "requires_grad", True)
    layout = split_conv._layout
    return ConvCall((function.sy, function.sx), (function.ph, function.pw),
                    (function.dy, function.dx), bool(function.cover_all), layout(x), layout(W),
                    layout(b), bool(wants_gx))


def with_gradient(call: ConvCall, gy: Any) -> ConvCall:
    """``call`` with the layout of the gradient its backward received."""
    return dataclasses.replace(call, gy=split_conv._layout(gy))


_MEASURED: dict[tuple, tuple[list[Config], list[Config]]] = {}


def measured_configs(call: ConvCall, device: Any) -> tuple[list[Config], list[Config]]:
    """``measure`` on ``device`` (a RuntimeDevice: its array module, and its allocation
    counter where it has one), once per call and device kind."""
    key = (call, device.kind)
    if key not in _MEASURED:
        counter = getattr(device, "counter", None)
        with counter.apart() if counter is not None else nullcontext():
            _MEASURED[key] = measure(call, device.xp, counter)
    return _MEASURED[key]


def measure(call: ConvCall, xp: Any, counter: Any = None, repeats: int = 2
            ) -> tuple[list[Config], list[Config]]:
    """(forward, backward) configurations as (pieces, scratch bytes change, seconds change)
    against whole: measured on probes with ``xp`` (NumPy or CuPy); scratch is measured by
    ``counter`` (the CPU device's allocation counter) or, for CuPy, by the pool; with
    neither, none is offered."""
    if counter is None and xp is not numpy:
        counter = PoolCounter(xp)
        with counter.hook:
            return measure(call, xp, counter, repeats)
    if counter is None:
        return [], []
    x, W = split_conv.probe(xp, call.x, 1), split_conv.probe(xp, call.W, 2)
    b = split_conv.probe(xp, call.b, 3) if call.b is not None else None
    n, c_in, c_out = x.shape[0], x.shape[1], W.shape[0]
    conv = Convolution2DFunction(call.stride, call.pad, call.cover_all, dilate=call.dilate)
    y, = original_compute_core(conv, xp)(x, W, b)
    gy = split_conv.probe(xp, call.gy or split_conv._layout(xp.ascontiguousarray(y)), 4)
    del y
    deconv = Deconvolution2DFunction(call.stride, call.pad, outsize=x.shape[2:],
                                     dilate=call.dilate)
    deconv._calc_out_size(gy.shape, W.shape)
    grad_w = Convolution2DGradW(conv, W.shape, W.dtype, None)

    def forward(pieces: int) -> Callable[[], Any]:
        def run() -> Any:
            # a fresh node, as the executor splits one: its exactness check is then the one
            # the run looks up (a node that ran has output sizes its key would include)
            node = Convolution2DFunction(call.stride, call.pad, call.cover_all,
                                         dilate=call.dilate)
            return split_conv._run_part(node, split_conv._forward_pieces, (x, W, b), pieces,
                                        True)
        return run

    def backward(pieces: int) -> Callable[[], Any]:
        def run() -> tuple:
            # the input gradient stays alive while the weight gradient runs, as in Chainer's
            # backward (split_conv._backward): the scratch measured is the one that runs
            gx = split_conv._run_part(deconv, split_conv._input_gradient_pieces,
                                      (gy, W, None), pieces, True) if call.wants_gx else None
            gW = split_conv._run_part(grad_w, split_conv._weight_gradient_pieces, (x, gy),
                                      pieces, True)
            return gx, gW
        return run

    out = []
    # 2, 8, 32, ...: each a quarter of the scratch of the one before
    for runner, counts in ((forward, piece_counts(n, MEASURED_FACTOR)),
                           (backward, piece_counts(max(n, c_in * c_out), MEASURED_FACTOR))):
        whole_s, whole_b = _cost(runner(1), xp, counter, repeats)
        configs = []
        for pieces in counts:
            seconds, scratch = _cost(runner(pieces), xp, counter, repeats)
            if scratch < whole_b:        # else a part was not exact here (ran whole)
                configs.append((pieces, scratch - whole_b, seconds - whole_s))
        out.append(configs)
    return out[0], out[1]


class PoolCounter:
    """The CPU counter's ``live`` / ``reset_peak`` / ``peak`` for CuPy's default pool: its
    used bytes, and their highest value after any allocation while ``hook`` is entered."""

    def __init__(self, cupy: Any) -> None:
        self.pool = cupy.get_default_memory_pool()
        self.hook = pool_peak_hook(cupy)

    def live(self) -> int:
        return int(self.pool.used_bytes())

    def reset_peak(self) -> None:
        self.hook.reset()

    def peak(self) -> int:
        return int(self.hook.peak)


def _cost(run: Callable[[], Any], xp: Any, counter: Any, repeats: int) -> tuple[float, int]:
    """(best seconds, scratch bytes) of ``run``; the first call (exactness probes) untimed."""
    run()
    best, scratch = float("inf"), 0
    for _ in range(repeats):
        if counter is not None:
            live = counter.live()
            counter.reset_peak()
        start = time.perf_counter()
        run()
        if xp is not numpy:
            xp.cuda.Device().synchronize()
        best = min(best, time.perf_counter() - start)
        if counter is not None:
            scratch = max(scratch, counter.peak() - live)
    return best, scratch
