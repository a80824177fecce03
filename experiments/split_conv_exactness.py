"""Which convolution splits are bit-identical to Chainer's own on this machine's BLAS.

2D and N-D (3D as in ResNeXt-101 3D: its 7x7x7 stem, grouped 3x3x3, 1x1x1; batch 1 and 2).

For a few convolution shapes (VGG-like, ResNet-like, strided, dilated) and piece counts, runs
the forward, the input gradient and the weight gradient whole and in pieces on the same
random data (gradients with a contiguous and with a channels-last incoming gradient) and
prints, per part, in how many cases the pieces gave the same bits. Issue 14's split
convolutions use a split only where it is exact for the call's own layouts.

    OPENBLAS_NUM_THREADS=1 python experiments/split_conv_exactness.py
"""
from __future__ import annotations

from contextlib import nullcontext

import numpy as np

import pooch_ext  # noqa: F401
import chainer
import chainer.functions as F
from chainer.functions.connection.convolution_2d import Convolution2DFunction, Convolution2DGradW
from chainer.functions.connection.deconvolution_2d import Deconvolution2DFunction

from pooch_ext.hooks import split_conv

SHAPES = [  # (x shape, W shape, stride, pad, dilate)
    ((8, 64, 56, 56), (64, 64, 3, 3), 1, 1, 1),
    ((8, 128, 28, 28), (256, 128, 3, 3), 2, 1, 1),
    ((8, 256, 14, 14), (256, 256, 1, 1), 1, 0, 1),
    ((4, 3, 64, 64), (32, 3, 7, 7), 2, 3, 1),
    ((6, 32, 20, 20), (32, 32, 3, 3), 1, 2, 2),
]
PIECES = (2, 3, 4, 8)
ND_SHAPES = [  # (x shape, W shape, convolution_nd keywords)
    ((1, 3, 16, 64, 64), (16, 3, 7, 7, 7), dict(stride=(1, 2, 2), pad=3)),
    ((1, 64, 8, 28, 28), (64, 2, 3, 3, 3), dict(stride=1, pad=1, groups=32)),
    ((1, 128, 8, 28, 28), (64, 128, 1, 1, 1), dict(stride=1, pad=0)),
    ((2, 32, 8, 28, 28), (32, 32, 3, 3, 3), dict(stride=1, pad=1)),
    ((1, 64, 8, 28, 28), (128, 64, 1, 1, 1), dict(stride=2, pad=0)),
]
ND_PIECES = (2, 8, 32)


def _nd_parts(x, W, kwargs, config=None) -> tuple:
    """(forward, input gradient, weight gradient) of one convolution_nd, in ``config``'s
    pieces unchecked (every part split) or whole."""
    xv, Wv = chainer.Variable(x), chainer.Variable(W)
    with split_conv.SplitConvolutions(config, checked=False) if config else nullcontext():
        y = F.convolution_nd(xv, Wv, **kwargs)
    y.grad = np.random.RandomState(5).standard_normal(y.shape).astype(x.dtype)
    y.backward()
    return y.array, xv.grad, Wv.grad


def nd_counts(rng) -> dict:
    counts = {part: [0, 0] for part in ("forward", "input_grad", "weight_grad")}
    for x_shape, w_shape, kwargs in ND_SHAPES:
        x = rng.standard_normal(x_shape).astype(np.float32)
        W = rng.standard_normal(w_shape).astype(np.float32)
        whole = _nd_parts(x, W, kwargs)
        for pieces in ND_PIECES:
            mine = _nd_parts(x, W, kwargs, split_conv.ConvSplit(pieces, pieces, pieces))
            for part, a, b in zip(counts, mine, whole):
                counts[part][0] += bool(np.array_equal(a, b))
                counts[part][1] += 1
    return counts


def main() -> None:
    rng = np.random.RandomState(0)
    counts = {part: [0, 0] for part in ("forward", "input_grad", "weight_grad")}
    for x_shape, w_shape, stride, pad, dilate in SHAPES:
        x = rng.standard_normal(x_shape).astype(np.float32)
        W = rng.standard_normal(w_shape).astype(np.float32)
        conv = Convolution2DFunction(stride=stride, pad=pad, dilate=dilate)
        y = F.convolution_2d(x, W, stride=stride, pad=pad, dilate=dilate).array
        gys = [rng.standard_normal(y.shape).astype(np.float32)]
        gys.append(np.ascontiguousarray(gys[0].transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2))
        deconv = Deconvolution2DFunction(stride=stride, pad=pad, outsize=x_shape[2:],
                                         dilate=dilate)
        deconv._calc_out_size(gys[0].shape, w_shape)
        grad_w = Convolution2DGradW(conv, w_shape, W.dtype, None)
        for pieces in PIECES:
            whole = conv._forward_cpu_core(x, W, None)[0]
            mine = split_conv._forward_pieces(conv, x, W, None, pieces)[0]
            counts["forward"][0] += bool(np.array_equal(whole, mine))
            counts["forward"][1] += 1
            for gy in gys:
                whole = deconv._forward_cpu_core(gy, W, None)[0]
                mine = split_conv._input_gradient_pieces(deconv, gy, W, None, pieces)[0]
                counts["input_grad"][0] += bool(np.array_equal(whole, mine))
                counts["input_grad"][1] += 1
                whole = grad_w._forward_cpu_core(x, gy)[0]
                mine = split_conv._weight_gradient_pieces(grad_w, x, gy, pieces)[0]
                counts["weight_grad"][0] += bool(np.array_equal(whole, mine))
                counts["weight_grad"][1] += 1
    print(f"{'part':<12} bit-identical / cases   ({len(SHAPES)} 2D shapes x pieces {PIECES})")
    for part, (same, total) in counts.items():
        print(f"{part:<12} {same:>3} / {total}")
    print(f"{'N-D part':<12} bit-identical / cases   ({len(ND_SHAPES)} 3D shapes x pieces "
          f"{ND_PIECES})")
    for part, (same, total) in nd_counts(rng).items():
        print(f"{part:<12} {same:>3} / {total}")


if __name__ == "__main__":
    main()
