"""Which split convolutions are exact (issue 14): a split part runs in pieces only where it
gave the whole part's bits and layout on random probes laid out as the call's arrays, on this
device, with this BLAS (the kernel a BLAS picks depends on the matrix sizes, so a whole
reduction per output element is not enough for equal bits). hooks/split_conv.py (2D) and
hooks/split_conv_nd.py (N-D, grouped) share it; hooks/conv_configs.py measures with it.
"""
from __future__ import annotations

from typing import Any

import numpy

import pooch_ext  # noqa: F401  (chainer import compat)
from chainer import backend

from pooch_ext.hooks.chainer_refs import original_compute_core, set_compute_core
from pooch_ext.hooks.device import dense_layout


def piece_bounds(n: int, pieces: int) -> list[tuple[int, int]]:
    """``n`` items in ``pieces`` contiguous pieces as even as possible (never an empty one)."""
    pieces = max(1, min(int(pieces), n))
    edges = [n * k // pieces for k in range(pieces + 1)]
    return list(zip(edges[:-1], edges[1:]))


TRIALS = 3      # random probes a split must match bit for bit on
_EXACT: dict[tuple, bool] = {}
_ATTRS = ("sy", "sx", "ph", "pw", "dy", "dx", "cover_all", "outh", "outw", "kh", "kw", "W_dtype",
          "ndim", "stride", "pad", "dilate", "groups", "outs", "ksize")


KNOWN = "known"   # ``checked`` value: split only where a check already found it exact


def run_part(self: Any, pieces_core: Any, args: tuple, pieces: int, checked: bool | str
             ) -> tuple:
    """The part in ``pieces`` where that is exact for these arrays (or not ``checked``),
    else whole, as Chainer runs it. ``checked`` KNOWN: only where an earlier check found it
    exact, never probing here (inside an op whose memory and time are being measured)."""
    whole_core = original_compute_core(self, backend.get_array_module(args[0]))
    if pieces > 1:
        if checked == KNOWN:
            exact = _EXACT.get(_key(self, pieces_core, args, pieces), False)
        else:
            exact = not checked or _exact(self, pieces_core, whole_core, args, pieces)
        if exact:
            return pieces_core(self, *args, pieces)
    return whole_core(*args)


def piece_part(pieces_core: Any, part: str) -> Any:
    """The core that runs ``pieces_core`` in the pieces its node's split (``_pooch_split``:
    a ConvSplit and whether to check) gives ``part`` ("forward", "input_grad" or
    "weight_grad"), where exact: what set_compute_core installs on a node."""
    def core(self: Any, *arrays: Any) -> tuple:
        config, checked = self._pooch_split
        return run_part(self, pieces_core, arrays, getattr(config, part), checked)
    core.__name__ = f"{pieces_core.__name__}_{part}"
    return core


def split_node(owner: Any, node: Any, core: Any, pieces: int) -> Any:
    """``node`` (a function of ``owner``'s backward) running ``core`` in ``pieces`` (if more
    than one), with ``owner``'s split and check."""
    node._pooch_split = owner._pooch_split
    if pieces > 1:
        set_compute_core(node, core)
    return node


def split_backward(self: Any, indexes: tuple, grad_outputs: tuple, deconvolution: Any,
                   weight_gradient: Any, bias_gradient: Any, cores: tuple) -> list:
    """A split convolution's backward, as Chainer's: the input gradient by the
    ``deconvolution(x, W)`` node, the weight gradient by the ``weight_gradient(W)`` node, each
    running its core of ``cores`` (input, weight) in ``self``'s pieces, and
    ``bias_gradient(gy)``. hooks/split_conv.py (2D) and split_conv_nd.py give the nodes."""
    x, W = self.get_retained_inputs()
    gy, = grad_outputs
    config, _ = self._pooch_split
    ret = []
    if 0 in indexes:
        node = split_node(self, deconvolution(x, W), cores[0], config.input_grad)
        ret.append(node.apply((gy, W))[0])
    if 1 in indexes:
        node = split_node(self, weight_gradient(W), cores[1], config.weight_grad)
        ret.append(node.apply((x, gy))[0])
    if 2 in indexes:
        ret.append(bias_gradient(gy))
    return ret


def layout(a: Any) -> tuple | None:
    """(shape, strides, dtype string) of ``a``: what a probe copies and an exactness key holds."""
    return None if a is None else (a.shape, a.strides, a.dtype.str)


def restored_layouts(layout: tuple | None) -> list[tuple]:
    """The layouts a swap round trip may give back an array laid out as ``layout``: dense in
    its own axis order (the CPU device's copies, cpu_device.layout_view) or in C order
    (CuPy's, CupyDevice.swap_out); none for a dense layout, which comes back as it left. A
    convolution whose input is a non-dense view (a channel slice, ``h[:, :4]``) reads it so
    in a backward after a swap, and an exactness check unknown there probed inside the op:
    a user's swap-all profiling iteration held 0.47 MB of probes over its budget."""
    if layout is None:
        return []
    shape, strides, dtype = layout
    itemsize = numpy.dtype(dtype).itemsize
    if dense_layout(shape, strides, itemsize):
        return []
    found = []
    for order in (sorted(range(len(shape)), key=lambda a: -abs(strides[a])),
                  list(range(len(shape)))):
        dense, step = [0] * len(shape), itemsize
        for axis in reversed(order):
            dense[axis], step = step, step * shape[axis]
        found.append((tuple(shape), tuple(dense), dtype))
    return list(dict.fromkeys(found))


def _probe_like(a: Any, seed: int) -> Any:
    """A probe with ``a``'s shape, strides and dtype, on ``a``'s device (``probe``)."""
    if a is None:
        return None
    return probe(backend.get_array_module(a), layout(a), seed)


def probe(xp: Any, layout: tuple, seed: int) -> Any:
    """An array of ``xp`` (NumPy or CuPy) laid out as ``layout`` = (shape, strides, dtype
    string), gaps included, whose values span 2**-8 .. 2**8 in magnitude: any change in the
    order of a reduction changes the rounding of some output element (with values of one
    scale it may not). Made on the array's own device: host-made probes of ResNet-50's maps
    took seconds each on the GPU machine."""
    shape, strides, dtype = layout
    if not probeable(layout):
        raise ValueError("no probe for negative or unaligned strides")
    itemsize = numpy.dtype(dtype).itemsize
    span = 1 + sum((dim - 1) * stride // itemsize for dim, stride in zip(shape, strides))
    if xp is numpy:     # NumPy's Generator: a third of RandomState's time (6 ms a probe before)
        gen = numpy.random.default_rng(seed)
        values = numpy.ldexp(gen.standard_normal(span), gen.integers(-8, 9, span)).astype(dtype)
    else:
        rng = xp.random.RandomState(seed)
        values = (rng.standard_normal(span) * 2.0 ** rng.randint(-8, 9, span)).astype(dtype)
    return xp.lib.stride_tricks.as_strided(values, shape, strides)


def probeable(layout: tuple | None) -> bool:
    """Whether ``probe`` can copy ``layout`` (None: an absent array, nothing to copy)."""
    if layout is None:
        return True
    _, strides, dtype = layout
    itemsize = numpy.dtype(dtype).itemsize
    return all(stride >= 0 and stride % itemsize == 0 for stride in strides)


def _key(self: Any, pieces_core: Any, args: tuple, pieces: int) -> tuple:
    return (pieces_core.__module__, pieces_core.__qualname__, pieces,
            tuple(getattr(self, a, None) for a in _ATTRS), tuple(layout(a) for a in args))


def _exact(self: Any, pieces_core: Any, whole_core: Any, args: tuple, pieces: int) -> bool:
    """Whether ``pieces_core`` gives ``whole_core``'s bits and layout on ``TRIALS`` probes
    laid out as ``args``; remembered per layouts and attributes."""
    key = _key(self, pieces_core, args, pieces)
    if key not in _EXACT:
        _EXACT[key] = all(_same_on_probes(self, pieces_core, whole_core, args, pieces, trial)
                          for trial in range(TRIALS))     # stops at the first difference
    return _EXACT[key]


def _same_on_probes(self: Any, pieces_core: Any, whole_core: Any, args: tuple, pieces: int,
                    trial: int) -> bool:
    try:
        probes = [_probe_like(a, 7 * trial + k) for k, a in enumerate(args)]
    except ValueError:          # a layout no probe can copy: never split
        return False
    with numpy.errstate(all="ignore"):     # the probes' overflow is not the user's
        mine, = pieces_core(self, *probes, pieces)
        theirs, = whole_core(*probes)
    return mine.strides == theirs.strides and bool((mine == theirs).all())
