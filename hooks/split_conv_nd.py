"""Split N-D convolutions (issue 14): ``ConvolutionND`` (grouped or not; 3D in ResNeXt-101 3D)
run in pieces, each piece Chainer's own core on a slice, so results stay bit-identical where
hooks/split_exact.py found them so and the column buffer shrinks by the number of pieces.

The pieces (``analytic.splits.nested_pieces``, the cost model's rule too):
- forward: over the batch, then over the output's first dimension (rows: depth in 3D). A
  row piece reads the input rows its outputs need, zero-filled where the padding was, and runs
  the core without padding in that dimension: every output element's reduction stays whole.
  This is what makes batch 1 splittable (ResNeXt-101 3D at 3x128x448x448).
- input gradient (a DeconvolutionND): over the batch, then over channel units (single input
  channels, or groups when grouped: each group's GEMM stays the one Chainer runs).
- weight gradient (a ConvolutionNDGradW): over channel units, then the kernel's offsets in
  the first dimension (a crop of the input with the sub-kernel's reach), then output
  channels when ungrouped; the reduction over batch and pixels stays one GEMM per element.

Outputs keep the layout Chainer's whole core gives (the exactness check compares strides).
Not split: ``cover_all`` convolutions (their output size is not a function of the pieces) and
cuDNN-run ones (CuPy 14 has none; a node that runs cuDNN never calls the core replaced here).
"""
from __future__ import annotations

from typing import Any

import numpy

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer
from chainer import backend
from chainer.functions.connection.convolution_nd import ConvolutionNDGradW
from chainer.functions.connection.deconvolution_nd import DeconvolutionND

from pooch_ext.analytic.splits import nd_loops, nested_pieces
from pooch_ext.hooks.chainer_refs import original_compute_core
from pooch_ext.hooks.split_exact import piece_bounds, piece_part, split_backward

_CORE_ATTRS = ("ndim", "stride", "pad", "cover_all", "dilate", "groups", "outs", "ksize",
               "W_dtype")


def _sub(node: Any, **changes: Any) -> Any:
    """A bare node of ``node``'s class with its core's attributes and ``changes``: only its
    core is called (never applied), on a slice of the arrays."""
    sub = object.__new__(type(node))
    sub.__dict__.update({a: getattr(node, a) for a in _CORE_ATTRS if hasattr(node, a)})
    sub.__dict__.update(changes)
    return sub


def _core(node: Any, xp: Any, *arrays: Any) -> Any:
    out, = original_compute_core(node, xp)(*arrays)
    return out


def _rows(x: Any, start: int, stop: int) -> Any:
    """Rows ``start`` .. ``stop`` of ``x``'s first spatial dimension, zeros outside it (where
    the padding was): a view when all are inside."""
    size = x.shape[2]
    if start >= 0 and stop <= size:
        return x[:, :, start:stop]
    xp = backend.get_array_module(x)
    out = xp.zeros(x.shape[:2] + (stop - start,) + x.shape[3:], dtype=x.dtype)
    lo, hi = max(start, 0), min(stop, size)
    if hi > lo:
        out[:, :, lo - start:hi - start] = x[:, :, lo:hi]
    return out


def _no_pad_in_rows(node: Any) -> tuple:
    return (0,) + tuple(node.pad[1:])


def out_size(function: Any, x_shape: tuple, w_shape: tuple) -> tuple:
    """Output size of a convolution node or ConvCall (``stride``, ``pad``, ``dilate``,
    ``cover_all``, one per spatial dimension) on inputs of ``x_shape``."""
    return tuple(chainer.utils.conv.get_conv_outsize(size, k, s, p, cover_all=function.cover_all,
                                                     d=d)
                 for size, k, s, p, d in zip(x_shape[2:], w_shape[2:], function.stride,
                                             function.pad, function.dilate))


# ------------------------------------------------------------------ the parts, in pieces
def _forward_pieces(self: Any, x: Any, W: Any, b: Any, pieces: int) -> tuple:
    """ConvolutionND's core over batch slices, then output-row slices (``_rows`` inputs)."""
    xp = backend.get_array_module(x)
    n, c_out, dims = x.shape[0], W.shape[0], self.ndim
    k0, s0, p0, d0 = W.shape[2], self.stride[0], self.pad[0], self.dilate[0]
    outs = out_size(self, x.shape, W.shape)
    # the whole core's layout: (N, out..., C) rolled when ungrouped, (C, N, out...) grouped
    if self.groups > 1:
        y = xp.rollaxis(xp.empty((c_out, n) + outs, dtype=x.dtype), 1)
    else:
        y = xp.rollaxis(xp.empty((n,) + outs + (c_out,), dtype=x.dtype), dims + 1, 1)
    batch_pieces, row_pieces = nested_pieces(
        pieces, *nd_loops(self.groups, x.shape, (n, c_out) + outs, W.shape)["forward"])
    rows = _sub(self, pad=_no_pad_in_rows(self)) if row_pieces > 1 else self
    for i0, i1 in piece_bounds(n, batch_pieces):
        for r0, r1 in piece_bounds(outs[0], row_pieces):
            part = x[i0:i1] if row_pieces == 1 else \
                _rows(x[i0:i1], r0 * s0 - p0, (r1 - 1) * s0 - p0 + (k0 - 1) * d0 + 1)
            y[i0:i1, :, r0:r1] = _core(rows, xp, part, W, None)
            del part
    if b is not None:
        y += b.reshape((1, b.size) + (1,) * dims)
    return y,


def _backward(self: Any, indexes: tuple, grad_outputs: tuple) -> list:
    """ConvolutionND.backward whose input- and weight-gradient nodes run split."""
    def deconvolution(x: Any, W: Any) -> Any:
        return DeconvolutionND(self.ndim, self.stride, self.pad, outsize=x.shape[2:],
                               dilate=self.dilate, groups=self.groups)

    def bias_gradient(gy: Any) -> Any:
        gb = chainer.functions.sum(gy, axis=(0,) + tuple(range(2, gy.ndim)))
        if gb.dtype != self.inputs[2].dtype:
            gb = chainer.functions.cast(gb, self.inputs[2].dtype)
        return gb
    return split_backward(self, indexes, grad_outputs, deconvolution,
                          lambda W: ConvolutionNDGradW(self), bias_gradient,
                          (_input_gradient, _weight_gradient))


def _input_gradient_pieces(self: Any, gy: Any, W: Any, b: Any, pieces: int) -> tuple:
    """DeconvolutionND's core over batch slices, then channel units of its output (single
    channels: W's second axis; groups: their slices of gy and W), into the array Chainer's
    col2im makes (NumPy: a view into a padded image)."""
    xp = backend.get_array_module(gy)
    n, groups = gy.shape[0], self.groups
    c = W.shape[1] * groups
    # the loops of the convolution whose input gradient this is: its x is this node's output
    loops = nd_loops(groups, (n, c) + tuple(self.outs), gy.shape, W.shape)["input_grad"]
    units = loops[1]
    if xp is numpy:
        padded = numpy.zeros((n, c) + tuple(d + 2 * p + s - 1 for d, p, s
                                            in zip(self.outs, self.pad, self.stride)),
                             dtype=gy.dtype)
        gx = padded[(slice(None), slice(None)) + tuple(slice(p, p + d) for p, d
                                                       in zip(self.pad, self.outs))]
    else:
        gx = xp.empty((n, c) + tuple(self.outs), dtype=gy.dtype)
    batch_pieces, unit_pieces = nested_pieces(pieces, *loops)
    in_g, out_g = W.shape[0] // groups, W.shape[1]      # per group: gy channels, gx channels
    for i0, i1 in piece_bounds(n, batch_pieces):
        for u0, u1 in piece_bounds(units, unit_pieces):
            if groups > 1:
                sub = _sub(self, groups=u1 - u0)
                part = _core(sub, xp, gy[i0:i1, u0 * in_g:u1 * in_g], W[u0 * in_g:u1 * in_g],
                             None)
                gx[i0:i1, u0 * out_g:u1 * out_g] = part
            else:
                gx[i0:i1, u0:u1] = _core(self, xp, gy[i0:i1], W[:, u0:u1], None)
    if b is not None:
        gx += b.reshape((1, b.size) + (1,) * self.ndim)
    return gx,


def _weight_gradient_pieces(self: Any, x: Any, gy: Any, pieces: int) -> tuple:
    """ConvolutionNDGradW's core over channel units, then first-dimension kernel offsets
    (the input crop those offsets reach, unpadded in that dimension), then output channels
    (ungrouped only)."""
    xp = backend.get_array_module(x)
    groups, k = self.groups, self.ksize
    c_in, c_out = x.shape[1], gy.shape[1]
    loops = nd_loops(groups, x.shape, gy.shape, (c_out, c_in // groups) + tuple(k))
    units, _, outs = loops["weight_grad"]
    unit_pieces, offset_pieces, out_pieces = nested_pieces(pieces, *loops["weight_grad"])
    gW = xp.empty((c_out, c_in // groups) + tuple(k), dtype=self.W_dtype)
    in_g, out_g = c_in // units, c_out // units if groups > 1 else c_out
    s0, p0, d0, rows = self.stride[0], self.pad[0], self.dilate[0], gy.shape[2]
    for u0, u1 in piece_bounds(units, unit_pieces):
        xs = x[:, u0 * in_g:u1 * in_g]
        go = gy[:, u0 * out_g:u1 * out_g] if groups > 1 else gy
        for k0, k1 in piece_bounds(k[0], offset_pieces):
            sub = _sub(self, groups=u1 - u0 if groups > 1 else 1)
            crop = xs
            if offset_pieces > 1:
                sub = _sub(sub, ksize=(k1 - k0,) + tuple(k[1:]), pad=_no_pad_in_rows(self))
                crop = _rows(xs, k0 * d0 - p0, (k1 - 1) * d0 + (rows - 1) * s0 - p0 + 1)
            for o0, o1 in piece_bounds(outs, out_pieces):
                if groups > 1:
                    gW[u0 * out_g:u1 * out_g, :, k0:k1] = _core(sub, xp, crop, go)
                else:
                    gW[o0:o1, u0 * in_g:u1 * in_g, k0:k1] = _core(sub, xp, crop, gy[:, o0:o1])
            del crop
    return gW,


_forward = piece_part(_forward_pieces, "forward")
_input_gradient = piece_part(_input_gradient_pieces, "input_grad")
_weight_gradient = piece_part(_weight_gradient_pieces, "weight_grad")


# what split_conv.split installs on a ConvolutionND: its forward core and its backward
PARTS = (_forward, _backward)
