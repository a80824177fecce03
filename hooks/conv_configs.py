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
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

import numpy

from chainer.functions.connection.convolution_2d import (Convolution2DFunction,
                                                         Convolution2DGradW)
from chainer.functions.connection.convolution_nd import ConvolutionND, ConvolutionNDGradW
from chainer.functions.connection.deconvolution_2d import Deconvolution2DFunction
from chainer.functions.connection.deconvolution_nd import DeconvolutionND

from pooch_ext.analytic.costmodel import column_bytes
from pooch_ext.analytic.splits import most_pieces, piece_counts
from pooch_ext.hooks import split_conv, split_conv_nd, split_exact
from pooch_ext.hooks.chainer_refs import deconvolution_as_its_forward_sets, original_compute_core
from pooch_ext.hooks.pool_peak import pool_peak_hook

Layout = tuple        # (shape, strides, dtype string), split_exact.layout
MEASURED_FACTOR = 4   # piece counts measured: every fourth power of two (analytic: every one)
Config = tuple[int, int, float]


@dataclass(frozen=True)
class ConvCall:
    """One profiled convolution: its attributes and its arrays' layouts."""

    stride: tuple[int, ...]
    pad: tuple[int, ...]
    dilate: tuple[int, ...]
    cover_all: bool
    x: Layout
    W: Layout
    b: Layout | None
    wants_gx: bool       # its input receives a gradient
    gy: Layout | None = None   # its output's gradient as backward received it (None: unseen)
    nd: bool = False           # a ConvolutionND (hooks/split_conv_nd.py), else 2D
    groups: int = 1


def conv_call(function: Any, in_data: tuple) -> ConvCall | None:
    """The call of ``function`` on ``in_data`` if it can run split, else None (also where
    an input's layout has no probe to check a split's exactness on: a flipped view's
    negative strides, as ``x[..., ::-1]`` gives)."""
    if split_conv.not_splittable(function) or len(in_data) < 2 or \
            not all(split_exact.probeable(split_exact.layout(a)) for a in in_data[:3]):
        return None
    x, W = in_data[0], in_data[1]
    nd = type(function) is ConvolutionND
    y_shape = (x.shape[0], W.shape[0]) + split_conv_nd.out_size(function, x.shape, W.shape) if nd else None
    if (most_pieces(nd, x.shape, y_shape, W.shape, function.groups)[0] if nd
            else x.shape[0]) < 2:
        return None
    b = in_data[2] if len(in_data) > 2 else None
    node = function.inputs[0] if function.inputs else None
    wants_gx = node is None or getattr(node, "requires_grad", True)
    layout = split_exact.layout
    if nd:
        return ConvCall(function.stride, function.pad, function.dilate, bool(function.cover_all),
                        layout(x), layout(W), layout(b), bool(wants_gx), nd=True,
                        groups=int(function.groups))
    return ConvCall((function.sy, function.sx), (function.ph, function.pw),
                    (function.dy, function.dx), bool(function.cover_all), layout(x), layout(W),
                    layout(b), bool(wants_gx))


def with_gradient(call: ConvCall, gy: Any) -> ConvCall:
    """``call`` with the layout of the gradient its backward received."""
    return dataclasses.replace(call, gy=split_exact.layout(gy))


# (part, call, (device kind, counts)) -> that part's configurations. The forward part is keyed
# by the call without its gradient's layout, which only the backward part reads: a first iteration
# measures the forward before its backward has a gradient, and the backward once it has one
_MEASURED: dict[tuple, list[Config]] = {}
PARTS = ("forward", "backward")


def measured_configs(call: ConvCall, device: Any, parts: tuple[str, ...] = PARTS
                     ) -> tuple[list[Config], list[Config]]:
    """``measure`` on ``device`` (a RuntimeDevice: its array module, and its allocation
    counter where it has one), each part once per call, device kind and way of counting; a
    part left out of ``parts`` comes back empty (not measured)."""
    # a device that cannot count (the CPU device without its allocator) measures nothing:
    # its empty answer must not stand for a device of the same kind that can
    counter = getattr(device, "counter", None)
    how = (device.kind, counter is not None)
    keys = {"forward": ("forward", dataclasses.replace(call, gy=None), how),
            "backward": ("backward", call, how)}
    missing = tuple(part for part in parts if keys[part] not in _MEASURED)
    if missing:
        # probes span 2**-8 .. 2**8: their products may overflow a float16, which is the
        # probes' business, not the user's (np.seterr(over="raise") had stopped training)
        with device.apart(), numpy.errstate(all="ignore"):
            found = measure(call, device.xp, counter, parts=missing)
        for part, configs in zip(PARTS, found):
            if part in missing:
                _MEASURED[keys[part]] = configs
    forward, backward = (_MEASURED.get(keys[part], []) if part in parts else []
                         for part in PARTS)
    return forward, backward


def measure(call: ConvCall, xp: Any, counter: Any = None, repeats: int = 2,
            parts: tuple[str, ...] = PARTS) -> tuple[list[Config], list[Config]]:
    """(forward, backward) configurations as (pieces, scratch bytes change, seconds change)
    against whole: measured on probes with ``xp`` (NumPy or CuPy); scratch is measured by
    ``counter`` (the CPU device's allocation counter) or, for CuPy, by the pool; with
    neither, none is offered. A part left out of ``parts`` is not measured (empty)."""
    if counter is None and xp is not numpy:
        counter = PoolCounter(xp)
        with counter.hook:
            return measure(call, xp, counter, repeats, parts)
    if counter is None:
        return [], []
    x, W = split_exact.probe(xp, call.x, 1), split_exact.probe(xp, call.W, 2)
    b = split_exact.probe(xp, call.b, 3) if call.b is not None else None
    nodes = _nodes_nd if call.nd else _nodes_2d
    new_conv, deconv, grad_w, cores = nodes(call, x.shape, W)
    y, = original_compute_core(new_conv(), xp)(x, W, b)
    gy = split_exact.probe(xp, call.gy or split_exact.layout(xp.ascontiguousarray(y)), 4)
    del y
    # the input as a backward after its swap reads it: its weight gradient checked there too
    x_back = [split_exact.probe(xp, layout, 1) for layout in split_exact.restored_layouts(call.x)]
    forward_core, input_core, weight_core = cores
    if not call.nd:
        deconvolution_as_its_forward_sets(deconv, gy.shape, W.shape, gpu=xp is not numpy)

    def forward(pieces: int) -> Callable[[], Any]:
        def run() -> Any:
            # a fresh node, as the executor splits one: its exactness check is then the one
            # the run looks up (a node that ran has output sizes its key would include)
            return split_exact.run_part(new_conv(), forward_core, (x, W, b), pieces, True)
        return run

    def backward(pieces: int) -> Callable[[], Any]:
        def run() -> tuple:
            # the input gradient stays alive while the weight gradient runs, as in Chainer's
            # backward (split_conv._backward): the scratch measured is the one that runs
            gx = split_exact.run_part(deconv, input_core, (gy, W, None), pieces, True) \
                if call.wants_gx else None
            gW = split_exact.run_part(grad_w, weight_core, (x, gy), pieces, True)
            for restored in x_back:
                split_exact.run_part(grad_w, weight_core, (restored, gy), pieces, True)
            return gx, gW
        return run

    most_forward, most_backward = most_pieces(call.nd, x.shape, gy.shape, W.shape, call.groups,
                                              call.wants_gx)
    out = []
    # 2, 8, 32, ...: each a quarter of the scratch of the one before
    for part, runner, counts in (
            ("forward", forward, piece_counts(most_forward, MEASURED_FACTOR)),
            ("backward", backward, piece_counts(most_backward, MEASURED_FACTOR))):
        if part not in parts:
            out.append([])
            continue
        whole_s, whole_b = _cost(runner(1), xp, counter, repeats)
        configs = []
        for pieces in counts:
            seconds, scratch = _cost(runner(pieces), xp, counter, repeats)
            if scratch < whole_b:        # else a part was not exact here (ran whole)
                configs.append((pieces, scratch - whole_b, seconds - whole_s))
        out.append(configs)
    return out[0], out[1]


def _nodes_2d(call: ConvCall, x_shape: tuple, W: Any) -> tuple:
    """(a new forward node, the input- and weight-gradient nodes, the three piece cores)."""
    def new_conv() -> Any:
        return Convolution2DFunction(call.stride, call.pad, call.cover_all, dilate=call.dilate)
    deconv = Deconvolution2DFunction(call.stride, call.pad, outsize=x_shape[2:],
                                     dilate=call.dilate)
    grad_w = Convolution2DGradW(new_conv(), W.shape, W.dtype, None)
    return new_conv, deconv, grad_w, (split_conv._forward_pieces,
                                      split_conv._input_gradient_pieces,
                                      split_conv._weight_gradient_pieces)


def _nodes_nd(call: ConvCall, x_shape: tuple, W: Any) -> tuple:
    """``_nodes_2d`` for a ConvolutionND; the nodes' attributes are the ones the executor's
    nodes have when their cores run (the exactness checks' keys)."""
    ndim = len(x_shape) - 2

    def new_conv() -> Any:
        return ConvolutionND(ndim, call.stride, call.pad, call.cover_all, call.dilate,
                             call.groups)
    deconv = DeconvolutionND(ndim, call.stride, call.pad, outsize=tuple(x_shape[2:]),
                             dilate=call.dilate, groups=call.groups)
    deconv.cover_all = False         # as its forward finds it for a convolution without
    weight = SimpleNamespace(shape=W.shape, dtype=W.dtype)
    conv = new_conv()
    grad_w = ConvolutionNDGradW(SimpleNamespace(inputs=(None, weight), **{
        a: getattr(conv, a) for a in ("ndim", "stride", "pad", "cover_all", "dilate", "groups")}))
    return new_conv, deconv, grad_w, (split_conv_nd._forward_pieces,
                                      split_conv_nd._input_gradient_pieces,
                                      split_conv_nd._weight_gradient_pieces)


FIRST_SHARE = 8     # a first-iteration piece's column buffer: at most this share of the budget


def first_iteration_pieces(call: ConvCall, budget: int) -> tuple[int, int] | None:
    """(forward, backward) pieces for a convolution run before any plan (PoocH's first
    iteration, swapping on demand): whole, its column buffer and that buffer's GEMM-layout
    copy could exceed the device (a network that fits only with splits would run out of
    memory on a GPU before anything is known). Each part asks for the fewest measured
    piece count that brings them within 1 / FIRST_SHARE of ``budget``; None where whole
    already is. What runs is FirstIterationSplits' choice among the counts measured (checked
    exact before each part starts, the backward's on the gradient it receives, since a check
    inside the op would distort what the profile measures): the one that holds least. The
    backward's asked count stands only where its gradient never comes, when it runs whole."""
    x, w = call.x[0], call.W[0]
    itemsize = numpy.dtype(call.x[2]).itemsize
    y = (x[0], w[0]) + split_conv_nd.out_size(call, x, w)
    need = -(-2 * column_bytes(x, y, w, itemsize) // max(1, budget // FIRST_SHARE))
    if need <= 1:
        return None
    most = most_pieces(call.nd, x, y, w, call.groups, call.wants_gx)

    def fewest(limit: int) -> int:
        counts = piece_counts(limit, MEASURED_FACTOR) or [1]
        return next((c for c in counts if c >= need), counts[-1])
    return fewest(most[0]), fewest(most[1])


class FirstIterationSplits:
    """What runs on demand (PoocH's first iteration, before any plan or budget binds, and
    later the rest of an iteration that left its predicted graph): its convolutions split
    where whole they could exceed the device (``first_iteration_pieces``; whole, a
    stochastic-depth net's deviating iterations held 1.43 times the budget). A forward's
    pieces are measured before the op's clock starts, so the op finds their exactness
    checks (split_exact.KNOWN); the backward's once its gradient is known. ``active``
    False (splits are off): nothing is split."""

    def __init__(self, device: Any, budget_bytes: int, active: bool = True) -> None:
        self.device, self.budget_bytes, self.active = device, budget_bytes, active
        self._calls: dict[int, ConvCall] = {}       # by node, until its backward

    def pieces(self, function: Any, in_data: tuple) -> tuple[int, int] | None:
        if not self.active:
            return None
        call = conv_call(function, in_data)
        pieces = self._measured(call)
        if pieces is not None:
            self._calls[id(function)] = call
        return pieces

    def unrecorded(self, function: Any, in_data: tuple) -> tuple[int, int] | None:
        """Pieces for a convolution run with backprop off (an evaluation, a teacher's
        forward) at any time: no plan counts its memory, so it is split as the first
        iteration's are (whole, its column buffer alone held 2.4 times a user's budget)."""
        return self._measured(conv_call(function, in_data))

    def _measured(self, call: ConvCall | None) -> tuple[int, int] | None:
        """``first_iteration_pieces`` of ``call`` (None: not a convolution), the forward's
        measured (and checked exact) before the op runs, and run in the measured count that
        holds least (``_least``: asked for more pieces than are exact, a 3D convolution's
        forward ran whole, 2.8 times a user's budget at batch 2)."""
        pieces = None if call is None else first_iteration_pieces(call, self.budget_bytes)
        if pieces is not None:
            forward, _ = measured_configs(call, self.device, parts=("forward",))
            pieces = (_least(forward), pieces[1])
        return pieces

    def backward(self, function: Any, out_grad: tuple, pieces: tuple[int, int]
                 ) -> tuple[int, int]:
        """The (forward, backward) pieces ``function`` (split as ``pieces``) runs in, its
        backward's chosen on the gradient it receives: of the counts measured there, the
        one that holds least (``_least``). A part not exact in as many pieces as asked runs whole (a
        weight gradient split 32 ways over input channels rounds differently: a user's
        first iteration held 3.0 times its budget); fewer pieces may be exact and hold far
        less. Measured and run alike, so the profile still tells the whole op's memory."""
        call = self._calls.pop(id(function), None)
        if call is None or not out_grad or out_grad[0] is None:
            return pieces
        if not split_exact.probeable(split_exact.layout(out_grad[0])):
            split_conv.backward_in(function, 1)     # nothing to check its pieces on
            return pieces[0], 1
        _, backward = measured_configs(with_gradient(call, out_grad[0]), self.device)
        least = _least(backward)
        split_conv.backward_in(function, least)
        return pieces[0], least


def _least(configs: list[Config]) -> int:
    """The piece count of ``configs`` whose scratch is least (the fewest pieces among
    equals); 1 (whole) where none holds less than whole. A count whose split is not exact
    runs whole and is measured so, so the least is one that is exact."""
    return min(configs, key=lambda config: (config[1], config[0]))[0] if configs else 1


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
