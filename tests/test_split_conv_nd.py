"""Split N-D convolutions (hooks/split_conv_nd.py, issue 14): grouped and ungrouped
ConvolutionND in pieces over the batch, output rows, channel units and kernel offsets, exact
where checked, the same convolution in every piece count, and ResNeXt-101 3D at batch 1."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import pooch_ext  # noqa: F401
import chainer
import chainer.functions as F
import chainer.links as L

from pooch_ext.analytic.splits import most_pieces, nested_pieces
from pooch_ext.analytic.tracing import analytic_profile
from pooch_ext.hooks.split_conv import ConvSplit, SplitConvolutions, not_splittable, split
from pooch_ext.models.resnext3d import ResNeXtBottleneck3D, _conv
from pooch_ext.sim.budgets import minimum_budget
from pooch_ext.testing import states_equal, synthetic_batches, trained, where_only_splits_fit

GiB = 1 << 30
# (x shape, W shape, convolution_nd keywords): 3D and 2D, batch 1 and more, grouped, strided,
# padded beyond the kernel's reach, dilated, 1x1x1
CASES = [((1, 4, 9, 8, 7), (6, 4, 3, 3, 3), dict(stride=1, pad=1)),
         ((2, 8, 7, 6, 6), (8, 2, 3, 3, 3), dict(stride=2, pad=1, groups=4)),
         ((1, 3, 10, 12, 12), (5, 3, 7, 7, 7), dict(stride=(1, 2, 2), pad=3)),
         ((3, 6, 9, 9), (4, 6, 3, 3), dict(stride=1, pad=2, dilate=2)),
         ((1, 4, 6, 6, 6), (8, 4, 1, 1, 1), dict(stride=2, pad=0)),
         ((1, 8, 5, 6, 6), (8, 1, 3, 3, 3), dict(stride=1, pad=1, groups=8))]
PIECES = (2, 3, 7, 1000)


def _run(x, W, kwargs, config=None, checked=True, b=None):
    """(y, gx, gW, gb) of one convolution_nd and its backward, split by ``config``."""
    xv, Wv = chainer.Variable(x.copy()), chainer.Variable(W.copy())
    bv = chainer.Variable(b.copy()) if b is not None else None
    if config is None:
        y = F.convolution_nd(xv, Wv, bv, **kwargs)
    else:
        with SplitConvolutions(config, checked):
            y = F.convolution_nd(xv, Wv, bv, **kwargs)
    xp = chainer.backend.get_array_module(x)
    y.grad = xp.asarray(np.random.RandomState(5).standard_normal(y.shape).astype(x.dtype))
    y.backward()
    return y.array, xv.grad, Wv.grad, (bv.grad if bv is not None else None)


def _arrays(case, dtype, seed=0):
    x_shape, w_shape, kwargs = case
    rng = np.random.RandomState(seed)
    return (rng.standard_normal(x_shape).astype(dtype), rng.standard_normal(w_shape).astype(dtype),
            rng.standard_normal(w_shape[0]).astype(dtype), kwargs)


@pytest.mark.parametrize("case", CASES)
def test_checked_splits_give_chainers_bits_and_layouts(case):
    x, W, b, kwargs = _arrays(case, np.float32)
    whole = _run(x, W, kwargs, b=b)
    for pieces in PIECES:
        split_run = _run(x, W, kwargs, ConvSplit(pieces, pieces, pieces), b=b)
        for mine, theirs in zip(split_run, whole):
            assert mine.strides == theirs.strides and np.array_equal(mine, theirs)


@pytest.mark.parametrize("case", CASES)
def test_every_piece_count_computes_the_same_convolution(case):
    """Unchecked, in float64: what the pieces compute is the convolution (rounding apart),
    so the checks above pass because the pieces are right, not because they ran whole."""
    x, W, b, kwargs = _arrays(case, np.float64)
    whole = _run(x, W, kwargs, b=b)
    for pieces in PIECES:
        split_run = _run(x, W, kwargs, ConvSplit(pieces, pieces, pieces), checked=False, b=b)
        for mine, theirs in zip(split_run, whole):
            assert mine.shape == theirs.shape
            np.testing.assert_allclose(mine, theirs, rtol=1e-12, atol=1e-12)


def test_row_pieces_shrink_a_batch_of_one_sample():
    x, W, _, kwargs = _arrays(CASES[2], np.float32)

    def forward_peak(config):
        node = chainer.functions.connection.convolution_nd.ConvolutionND(
            3, kwargs["stride"], kwargs["pad"])
        if config is not None:
            split(node, config, checked=False)
        tracemalloc.start()
        node.apply((x, W))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return peak
    assert forward_peak(ConvSplit(8, 1, 1)) < forward_peak(None) / 3


def test_what_cannot_be_split_is_said():
    cover_all = chainer.functions.connection.convolution_nd.ConvolutionND(3, cover_all=True)
    assert "cover_all" in not_splittable(cover_all)
    with pytest.raises(ValueError, match="cover_all"):
        split(cover_all, ConvSplit(2, 2, 2))


def test_nested_pieces_fill_the_outer_loop_first():
    assert nested_pieces(1, 4, 9) == (1, 1)
    assert nested_pieces(3, 4, 9) == (3, 1)
    assert nested_pieces(8, 2, 9) == (2, 4)
    assert nested_pieces(1000, 2, 9, 5) == (2, 9, 5)
    assert most_pieces(True, (1, 4, 9, 9), (1, 6, 7, 7), (6, 4, 3, 3)) == (7, 4 * 3 * 6)
    assert most_pieces(True, (2, 8, 9, 9), (2, 8, 7, 7), (8, 2, 3, 3), groups=4) == (14, 12)


def test_resnext101_3d_at_batch_one_fits_16gib_only_with_splits():
    """The issue's target: 3x128x448x448, batch 1, on the im2col path (one op's column
    buffer alone is 24.6 GiB whole)."""
    profile = analytic_profile("resnext101-3d", 1, "3x128x448x448", conv="im2col")
    nd = profile.ops[profile.ops.name == "ConvolutionND"]
    assert all(len(c) for c in nd["configs"])
    assert minimum_budget(profile) <= 16 * GiB < minimum_budget(profile.without_configs())


class Tiny3D(chainer.Chain):
    """ResNeXt-101 3D's stem and one grouped bottleneck block, scaled down."""

    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.conv1 = _conv(3, 16, 7, (1, 2, 2), 3)
            self.bn1 = L.BatchNormalization(16)
            self.block = ResNeXtBottleneck3D(16, 32, 1, project=True)
            self.fc = L.Linear(None, 4)

    def forward(self, x):
        h = self.block(F.relu(self.bn1(self.conv1(x))))
        return self.fc(F.average(h, axis=(2, 3, 4)))


def test_a_3d_network_at_batch_one_trains_bit_identical_where_only_splits_fit():
    plain, plain_state, profile, budget, unsplit, tight, tight_state = where_only_splits_fit(
        lambda pooch: trained(Tiny3D, synthetic_batches(4, 1, (3, 16, 32, 32), 4), pooch))
    assert all(len(c) for c in profile.ops[profile.ops.name == "ConvolutionND"]["configs"])
    assert minimum_budget(profile) < unsplit
    pooch = tight.pooch
    assert pooch.plan.feasible and pooch.plan.configs
    ran = pooch.runtime.history[-1].splits
    assert ran and set(ran) <= set(pooch.program.splits)
    assert tight.losses == plain.losses and states_equal(tight_state, plain_state)
    assert not pooch.overruns
    # the first iteration, before any plan, splits its convolutions too: whole, it would need
    # more than any whole plan (on a GPU: run out of memory before PoocH knows anything)
    first = pooch.iterations.iloc[0]
    assert first.program == "on-demand" and first.splits and first.peak_bytes < unsplit


@pytest.mark.gpu
def test_on_the_gpu_checked_nd_splits_give_chainers_bits():
    """The CuPy path (im2col_nd_gpu / col2im_nd_gpu, cuBLAS; cuDNN off, as with CuPy 14):
    what the check lets run split gives Chainer's own bits and layouts; unchecked, the same
    convolution within float32 rounding. Not yet run on a GPU (none lent since it was
    written)."""
    import cupy

    with chainer.using_config("use_cudnn", "never"):
        for case in CASES:
            x, W, b, kwargs = (cupy.asarray(a) if isinstance(a, np.ndarray) else a
                               for a in _arrays(case, np.float32))
            whole = _run(x, W, kwargs, b=b)
            for pieces in PIECES:
                config = ConvSplit(pieces, pieces, pieces)
                for mine, theirs in zip(_run(x, W, kwargs, config, b=b), whole):
                    assert mine.strides == theirs.strides and bool((mine == theirs).all())
                for mine, theirs in zip(_run(x, W, kwargs, config, checked=False, b=b), whole):
                    cupy.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-3)
