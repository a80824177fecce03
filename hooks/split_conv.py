"""Split convolutions (issue 14): Chainer's im2col convolution run in pieces, so that its
column buffer (kh*kw times the input: a transient no keep/swap/recompute plan can touch)
shrinks by the number of pieces, with results bit-identical to Chainer's own.

Chainer 7 without cuDNN runs ``Convolution2DFunction`` as im2col + one GEMM, its input
gradient as ``Deconvolution2DFunction`` (GEMM + col2im) and its weight gradient as
``Convolution2DGradW`` (im2col + GEMM). The splits that keep every output element's
reduction whole: the forward and the input gradient over the batch, the weight gradient over
input channels (over the batch its reduction would be cut in two).

Whole reductions are not enough for equal bits, though: the BLAS picks its kernel by the
matrix sizes, and a piece's GEMM has other sizes. Measured here (OpenBLAS 0.3.31, Haswell
kernels, 1 thread): the input gradient was bit-identical in every case tried, the forward
and the weight gradient differed in some (by about 1e-6 relative). So a split is used only
where it was found bit-identical on probes with the very shapes, strides and dtypes of the
call's arrays, on this device, with this BLAS (the kernel choice depends on those, and the
layout of an incoming gradient matters too); elsewhere that part runs whole.

``split(function, ConvSplit(...))`` installs the pieces on one function node about to run,
per instance (Chainer's classes and every other convolution are untouched); outputs keep
Chainer's memory layout, so what reads them (reductions included) computes the same. The
CuPy path uses the same code with CuPy's im2col/col2im and cuBLAS; on an H100 (CuPy 14,
cuDNN off) the split forward was bit-identical where the check allowed it and the `gpu`
tests pass (results/gpu/README.md).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer
from chainer import backend
from chainer.functions.connection.convolution_2d import (Convolution2DFunction,
                                                         Convolution2DGradW)
from chainer.functions.connection.convolution_nd import ConvolutionND
from chainer.functions.connection.deconvolution_2d import Deconvolution2DFunction
from chainer.utils import conv

from pooch_ext.analytic.splits import nested_pieces
from pooch_ext.hooks.chainer_refs import WeaklyBound, set_compute_core
from pooch_ext.hooks import split_conv_nd
from pooch_ext.hooks.split_exact import piece_bounds, piece_part, split_backward


@dataclass(frozen=True)
class ConvSplit:
    """How one convolution runs: its forward and its input gradient in pieces over the batch,
    its weight gradient in pieces over input channels (1: whole, as Chainer runs it)."""

    forward: int = 1
    input_grad: int = 1
    weight_grad: int = 1

    def __post_init__(self) -> None:
        if min(self.forward, self.input_grad, self.weight_grad) < 1:
            raise ValueError(f"a split needs at least one piece, got {self}")


def not_splittable(function: Any) -> str:
    """Why ``function`` cannot run split; "" when it can (a Convolution2DFunction here, a
    ConvolutionND in hooks/split_conv_nd.py)."""
    if type(function) is ConvolutionND:
        return "cover_all convolutions have outputs no piece reproduces" \
            if function.cover_all else ""
    if type(function) is not Convolution2DFunction:
        return f"{type(function).__name__} is not a Convolution2DFunction or ConvolutionND"
    if function.groups != 1:
        return "grouped 2D convolutions run their own loop"
    if getattr(function, "cudnn_fast", False):
        return "cudnn_fast convolutions use cuDNN's own layout"
    return ""


def split(function: Any, config: ConvSplit, checked: bool | str = True) -> None:
    """Run ``function`` (a convolution not yet applied) and its backward in the pieces of
    ``config``, each part only where it is bit-identical (``checked=False``: always, for
    measurements of rounding). Raises ValueError where ``not_splittable`` says no."""
    reason = not_splittable(function)
    if reason:
        raise ValueError(f"cannot split: {reason}")
    function._pooch_split = (config, checked)
    forward, backward = split_conv_nd.PARTS if type(function) is ConvolutionND \
        else (_forward, _backward)
    if config.forward > 1:
        set_compute_core(function, forward)
    if config.input_grad > 1 or config.weight_grad > 1:
        function.backward = WeaklyBound(backward, function)


def whole_backward(function: Any) -> None:
    """From now on ``function``'s backward runs whole, as Chainer's (its forward ran split or
    not): a later backward pass over the same graph (``chainer.grad``, then ``backward``)
    runs after the op's last one the plan knows of, where no split of it is planned."""
    backward_in(function, 1)


def backward_in(function: Any, pieces: int) -> None:
    """From now on a split ``function``'s backward runs in ``pieces`` (1: whole); an
    unsplit one is left as it is."""
    split_state = getattr(function, "_pooch_split", None)
    if split_state is not None:
        config, checked = split_state
        split(function, replace(config, input_grad=pieces, weight_grad=pieces), checked)


def _backward(self: Any, indexes: tuple, grad_outputs: tuple) -> list:
    """Convolution2DFunction.backward whose input- and weight-gradient nodes run split."""
    def deconvolution(x: Any, W: Any) -> Any:
        return Deconvolution2DFunction(stride=(self.sy, self.sx), pad=(self.ph, self.pw),
                                       outsize=x.shape[2:], dilate=(self.dy, self.dx),
                                       groups=self.groups)

    def weight_gradient(W: Any) -> Any:
        return Convolution2DGradW(self, W.shape, W.dtype, W.layout)

    def bias_gradient(gy: Any) -> Any:
        return chainer.functions.sum(gy, axis=(0, 2, 3))
    return split_backward(self, indexes, grad_outputs, deconvolution, weight_gradient,
                          bias_gradient, (_input_gradient, _weight_gradient))


# ------------------------------------------------------------------ the cores, in pieces
def _im2col(xp: Any) -> Any:
    return conv.im2col_cpu if xp is numpy else conv.im2col_gpu


def _forward_pieces(self: Any, x: Any, W: Any, b: Any, pieces: int) -> tuple:
    """Convolution2DFunction's im2col core, a piece of the batch at a time."""
    xp = backend.get_array_module(x)
    kh, kw = W.shape[2:]
    y = None
    for i0, i1 in piece_bounds(x.shape[0], pieces):
        col = _im2col(xp)(x[i0:i1], kh, kw, self.sy, self.sx, self.ph, self.pw,
                          cover_all=self.cover_all, dy=self.dy, dx=self.dx)
        part = xp.tensordot(col, W, ((1, 2, 3), (1, 2, 3))).astype(x.dtype, copy=False)
        del col
        if y is None:
            y = xp.empty((x.shape[0],) + part.shape[1:], dtype=part.dtype)
        y[i0:i1] = part
    if b is not None:
        y += b
    return xp.rollaxis(y, 3, 1),


def _input_gradient_pieces(self: Any, x: Any, W: Any, b: Any, pieces: int) -> tuple:
    """Deconvolution2DFunction's core (GEMM + col2im), a piece of the batch at a time, into
    the array Chainer's col2im makes (NumPy: a view into a padded image)."""
    xp = backend.get_array_module(x)
    n, c = x.shape[0], W.shape[1]
    h, w = self.outh, self.outw
    if xp is numpy:
        padded = numpy.zeros((n, c, h + 2 * self.ph + self.sy - 1, w + 2 * self.pw + self.sx - 1),
                             dtype=x.dtype)
        y = padded[:, :, self.ph:h + self.ph, self.pw:w + self.pw]
    else:
        y = xp.empty((n, c, h, w), dtype=x.dtype)
    col2im = conv.col2im_cpu if xp is numpy else conv.col2im_gpu
    for i0, i1 in piece_bounds(n, pieces):
        gcol = xp.tensordot(W, x[i0:i1], (0, 1)).astype(x.dtype, copy=False)
        gcol = xp.rollaxis(gcol, 3)
        y[i0:i1] = col2im(gcol, self.sy, self.sx, self.ph, self.pw, h, w,
                          dy=self.dy, dx=self.dx)
        del gcol
    if b is not None:
        y += b.reshape((1, b.size, 1, 1))
    return y,


def _weight_gradient_pieces(self: Any, x: Any, gy: Any, pieces: int) -> tuple:
    """Convolution2DGradW's core (im2col + GEMM) over a slice of input channels at a time,
    and, beyond one piece per input channel, over slices of output channels inside each
    (``nested_pieces``): every element's reduction over batch and pixels stays one GEMM."""
    xp = backend.get_array_module(x)
    if not (gy.flags.c_contiguous or gy.flags.f_contiguous) and 1 in gy.shape:
        gy = xp.ascontiguousarray(gy)      # as Chainer does (NumPy's tensordot needs it)
    in_pieces, out_pieces = nested_pieces(pieces, x.shape[1], gy.shape[1])
    gW = xp.empty((gy.shape[1], x.shape[1], self.kh, self.kw), dtype=self.W_dtype)
    for c0, c1 in piece_bounds(x.shape[1], in_pieces):
        col = _im2col(xp)(x[:, c0:c1], self.kh, self.kw, self.sy, self.sx, self.ph, self.pw,
                          cover_all=self.cover_all, dy=self.dy, dx=self.dx)
        for o0, o1 in piece_bounds(gy.shape[1], out_pieces):
            part = xp.tensordot(gy[:, o0:o1], col, ((0, 2, 3), (0, 4, 5)))
            gW[o0:o1, c0:c1] = part.astype(self.W_dtype, copy=False)
        del col
    return gW,


class SplitConvolutions(chainer.FunctionHook):
    """Split every splittable convolution applied while entered by ``config`` (each part only
    where exact; ``checked=False``: every part): for tests and measurements; PoocH's executor
    will choose per op from the plan."""

    name = "PoochSplitConvolutions"

    def __init__(self, config: ConvSplit, checked: bool = True) -> None:
        self.config = config
        self.checked = checked

    def forward_preprocess(self, function: Any, in_data: tuple) -> None:
        if not not_splittable(function) and not hasattr(function, "_pooch_split"):
            split(function, self.config, self.checked)


_forward = piece_part(_forward_pieces, "forward")
_input_gradient = piece_part(_input_gradient_pieces, "input_grad")
_weight_gradient = piece_part(_weight_gradient_pieces, "weight_grad")
