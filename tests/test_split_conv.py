"""Split convolutions (hooks/split_conv.py): every split is bit-identical to Chainer's own
convolution, forward and backward, in value and in memory layout, and training with them
gives the same parameters; the column buffer really shrinks."""
from __future__ import annotations

import contextlib
import tracemalloc

import numpy as np
import pytest

import pooch_ext  # noqa: F401
import chainer
import chainer.functions as F
import chainer.links as L

from pooch_ext.hooks import split_conv, split_exact
from pooch_ext.hooks.split_conv import ConvSplit, SplitConvolutions, not_splittable, split
from pooch_ext.hooks.split_exact import piece_bounds
from pooch_ext.testing import model_state, states_equal


def test_piece_bounds_cover_everything_once_without_empty_pieces():
    for n in range(1, 12):
        for pieces in range(1, 14):
            bounds = piece_bounds(n, pieces)
            assert bounds[0][0] == 0 and bounds[-1][1] == n
            assert all(a < b for a, b in bounds)
            assert all(b == c for (_, b), (c, _) in zip(bounds, bounds[1:]))
            assert len(bounds) == min(n, pieces)
    with pytest.raises(ValueError):
        ConvSplit(forward=0)


CASES = [   # (x shape, W shape, conv keyword arguments)
    ((5, 3, 11, 9), (4, 3, 3, 3), dict(stride=1, pad=1)),
    ((4, 6, 12, 12), (8, 6, 3, 3), dict(stride=2, pad=0)),
    ((3, 5, 10, 13), (2, 5, 5, 3), dict(stride=(2, 1), pad=(2, 1), cover_all=True)),
    ((6, 4, 9, 9), (3, 4, 3, 3), dict(stride=1, pad=2, dilate=2)),
    ((2, 7, 8, 8), (5, 7, 1, 1), dict()),
]


def _run(x, W, b, kwargs, config, checked=True):
    xv, Wv = chainer.Variable(x.copy()), chainer.Variable(W.copy())
    bv = None if b is None else chainer.Variable(b.copy())
    with SplitConvolutions(config, checked) if config is not None else contextlib.nullcontext():
        y = F.convolution_2d(xv, Wv, bv, **kwargs)
    gy = np.random.RandomState(1).standard_normal(y.shape).astype(y.dtype)
    y.grad = chainer.backend.get_array_module(y.array).asarray(gy)
    y.backward()
    grads = [xv.grad, Wv.grad] + ([] if bv is None else [bv.grad])
    return [y.array] + grads


def _case(case):
    shape, w_shape, kwargs = CASES[case]
    rng = np.random.RandomState(case)
    x = rng.standard_normal(shape).astype(np.float32)
    W = rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32) if case % 2 == 0 else None
    return x, W, b, kwargs


CONFIGS = [ConvSplit(2, 2, 1), ConvSplit(3, 3, 2), ConvSplit(64, 64, 64), ConvSplit(1, 1, 3)]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("config", CONFIGS)
def test_the_exact_parts_of_a_split_are_bit_identical_in_values_and_layout(case, config):
    """Checked on other data than the probes (same layouts): what runs split is exact."""
    x, W, b, kwargs = _case(case)
    whole = _run(x, W, b, kwargs, None)
    pieces = _run(x, W, b, kwargs, config)
    for mine, theirs in zip(pieces, whole):
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
        assert mine.strides == theirs.strides          # the same memory layout
        assert np.array_equal(mine, theirs)            # bit for bit (no NaN here)


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("config", CONFIGS)
def test_every_split_is_within_rounding_and_keeps_the_layout(case, config):
    """Unchecked splits compute the same function (what differs is the BLAS's rounding)."""
    x, W, b, kwargs = _case(case)
    whole = _run(x, W, b, kwargs, None)
    for mine, theirs in zip(_run(x, W, b, kwargs, config, checked=False), whole):
        assert mine.strides == theirs.strides
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-4)


def test_a_part_that_is_not_bit_identical_is_run_whole(monkeypatch):
    """A weight gradient off by one ulp in pieces is caught: that part runs whole, so the
    results are Chainer's; unchecked, the ulp shows."""
    x, W, b, kwargs = _case(0)
    pieces_core = split_conv._weight_gradient_pieces

    def off_by_an_ulp(self, x, gy, pieces):
        gW, = pieces_core(self, x, gy, pieces)
        return np.nextafter(gW, np.inf),
    monkeypatch.setattr(split_conv, "_weight_gradient",
                        split_exact.piece_part(off_by_an_ulp, "weight_grad"))
    whole = _run(x, W, b, kwargs, None)
    checked = _run(x, W, b, kwargs, ConvSplit(1, 1, 2))
    unchecked = _run(x, W, b, kwargs, ConvSplit(1, 1, 2), checked=False)
    assert all(np.array_equal(a, b) for a, b in zip(checked, whole))
    assert not np.array_equal(unchecked[2], whole[2])


@pytest.mark.parametrize("gpu", [False, True])
def test_a_measured_input_gradient_node_is_keyed_as_its_forward_will_find_it(gpu):
    """The measurement runs a Deconvolution2DFunction's core without its forward, so it sets
    what that forward sets first: forward_gpu sets cover_all, forward_cpu does not. Keyed
    without it, every planned input gradient on an H200 probed its exactness inside the op
    (probes and the whole op's scratch): out of the pool at 20 MB of a 20 MB budget."""
    import inspect

    from chainer.functions.connection.deconvolution_2d import Deconvolution2DFunction
    from pooch_ext.hooks.chainer_refs import deconvolution_as_its_forward_sets

    forward = inspect.getsource(getattr(Deconvolution2DFunction,
                                        "forward_gpu" if gpu else "forward_cpu"))
    sets_cover_all = "self._set_cover_all(" in forward
    assert sets_cover_all == gpu
    if gpu:
        assert forward.index("_set_cover_all(") < forward.index("_forward_gpu_core(")
    node = Deconvolution2DFunction(stride=1, pad=1, outsize=(8, 8))
    deconvolution_as_its_forward_sets(node, (2, 4, 8, 8), (4, 3, 3, 3), gpu=gpu)
    assert (node.outh, node.outw) == (8, 8)
    assert node.cover_all is (False if gpu else None)


def test_only_plain_convolutions_are_split():
    x = chainer.Variable(np.ones((2, 4, 6, 6), np.float32))
    W = chainer.Variable(np.ones((4, 2, 3, 3), np.float32))
    seen = []

    class Watch(chainer.FunctionHook):
        def forward_postprocess(self, function, in_data):
            seen.append((type(function).__name__, not_splittable(function)))
    with Watch():
        F.convolution_2d(x, W, groups=2)
        F.relu(x)
    assert seen[0][1] == "grouped 2D convolutions run their own loop"
    assert seen[1][1] == "ReLU is not a Convolution2DFunction or ConvolutionND"
    function = chainer.functions.connection.convolution_2d.Convolution2DFunction(groups=2)
    with pytest.raises(ValueError, match="cannot split: grouped"):
        split(function, ConvSplit(2, 2, 2))


class ConvNet(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.c1 = L.Convolution2D(3, 8, 3, pad=1)
            self.bn = L.BatchNormalization(8)
            self.c2 = L.Convolution2D(8, 8, 3, stride=2, pad=1)
            self.fc = L.Linear(None, 5)

    def __call__(self, x):
        h = F.relu(self.bn(self.c1(x)))
        return self.fc(F.relu(self.c2(h)))


def _train(config, steps=3):
    np.random.seed(0)
    model = ConvNet()
    optimizer = chainer.optimizers.MomentumSGD(0.01)
    optimizer.setup(model)
    rng = np.random.RandomState(0)
    for _ in range(steps):
        x = rng.standard_normal((6, 3, 12, 12)).astype(np.float32)
        t = rng.randint(0, 5, 6).astype(np.int32)
        if config is None:
            loss = F.softmax_cross_entropy(model(x), t)
        else:
            with SplitConvolutions(config):
                loss = F.softmax_cross_entropy(model(x), t)
        model.cleargrads()
        loss.backward()
        optimizer.update()
    return model_state(model, optimizer)


def test_training_with_split_convolutions_gives_the_same_parameters():
    plain = _train(None)
    assert states_equal(_train(ConvSplit(3, 3, 4)), plain)
    assert states_equal(_train(ConvSplit(6, 6, 8)), plain)


def _peak_bytes(config):
    x = chainer.Variable(np.ones((8, 16, 32, 32), np.float32))
    W = chainer.Variable(np.ones((16, 16, 3, 3), np.float32))
    tracemalloc.start()
    try:
        if config is None:
            y = F.convolution_2d(x, W, pad=1)
        else:
            with SplitConvolutions(config, checked=False):   # the pieces, exact or not
                y = F.convolution_2d(x, W, pad=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del y
    return peak


def test_split_forward_needs_a_fraction_of_the_column_buffer():
    """The column buffer of this convolution is 9x its 2 MiB input (18 MiB); in 8 pieces the
    forward's peak is the 2 MiB output plus an eighth of the buffer (and of a piece's output)."""
    whole, pieces = _peak_bytes(None), _peak_bytes(ConvSplit(8, 1, 1))
    column = 8 * 16 * 9 * 32 * 32 * 4
    assert whole >= column
    assert pieces < whole / 3


@pytest.mark.gpu
def test_on_the_gpu_what_runs_split_is_bit_identical_too():
    """The CuPy path (CuPy's im2col/col2im, cuBLAS; cuDNN off, as with CuPy 14): what the
    check lets run split gives Chainer's own bits; unchecked, within rounding."""
    import cupy

    with chainer.using_config("use_cudnn", "never"):
        _compare_on_gpu(cupy)


def _compare_on_gpu(cupy):
    for case in range(len(CASES)):
        x, W, b, kwargs = (cupy.asarray(a) if isinstance(a, np.ndarray) else a
                           for a in _case(case))
        whole = _run(x, W, b, kwargs, None)
        for config in CONFIGS:
            for mine, theirs in zip(_run(x, W, b, kwargs, config), whole):
                assert mine.strides == theirs.strides and bool((mine == theirs).all())
            for mine, theirs in zip(_run(x, W, b, kwargs, config, checked=False), whole):
                cupy.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-4)


def test_a_split_node_and_its_arrays_go_when_the_graph_does_without_the_cycle_collector():
    """A node holding a method bound to itself is a reference cycle: it and the arrays it
    retains would outlive the graph until the cycle collector ran, over a tight budget."""
    import gc
    import weakref

    x = chainer.Variable(np.random.RandomState(0).standard_normal((4, 3, 6, 6)).astype("f"))
    W = chainer.Variable(np.random.RandomState(1).standard_normal((2, 3, 3, 3)).astype("f"))
    node = chainer.functions.connection.convolution_2d.Convolution2DFunction(1, 1)
    split(node, ConvSplit(2, 2, 2), checked=False)
    gone = weakref.ref(node)
    enabled = gc.isenabled()
    gc.disable()
    try:
        y, = node.apply((x, W))
        del node
        F.sum(y).backward()
        del y
        assert gone() is None
    finally:
        if enabled:
            gc.enable()


@pytest.mark.gpu
def test_on_the_gpu_split_configurations_are_measured_from_the_pool():
    """Without the CPU counter, CuPy's pool (read after every allocation) measures what a
    split saves: the forward's column buffer shrinks with the pieces (8x16x9x32x32 floats)."""
    import cupy

    from pooch_ext.hooks import conv_configs

    x = cupy.asarray(np.random.RandomState(0).standard_normal((8, 16, 32, 32)).astype("f"))
    W = cupy.asarray(np.random.RandomState(1).standard_normal((16, 16, 3, 3)).astype("f"))
    node = chainer.functions.connection.convolution_2d.Convolution2DFunction(1, 1)
    with chainer.using_config("use_cudnn", "never"):
        forward, _ = conv_configs.measure(conv_configs.conv_call(node, (x, W)), cupy)
    column = 8 * 16 * 9 * 32 * 32 * 4
    saved = {pieces: -change for pieces, change, _ in forward}
    assert saved and all(column * (1 - 1 / p) * 0.9 <= saved[p] for p in saved), saved
