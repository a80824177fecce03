"""The CPU device's measured memory (every NumPy allocation, im2col columns and gradients
included) against the plan's prediction: the plan's peak is the measured peak within 5%, and
a feasible plan's measured peak never exceeds the budget, for networks and policies that move
maps in different ways. The prediction includes what profiling measured beyond the graph
model (hooks/measured_profile.unmodelled_bytes); without it the first case is known to fail (a
measured 27.5 MB against a 25.8 MB budget on small-resnet b16)."""
from __future__ import annotations

import numpy as np
import pytest

import chainer
import chainer.functions as F
import chainer.links as L

from pooch_ext.hooks import cpu_memory
from pooch_ext.hooks.cpu_device import CpuDevice
from pooch_ext.testing import synthetic_batches, train
from pooch_ext.measure import setup_model
from pooch_ext.pooch import PoocH
from pooch_ext.sim.budgets import budget_between, minimum_budget

pytestmark = pytest.mark.skipif(cpu_memory.counter() is None,
                                reason=f"no counting allocator here: {cpu_memory.failure}")
ITERS, PROFILE_ITERS = 5, 3


def _train(batch: int, pooch: dict):
    model, optimizer = setup_model("small-resnet", gpu=False)
    result = train(model, optimizer, synthetic_batches(ITERS, batch, (3, 32, 32), 10),
                   dict(pooch, device=CpuDevice(link="cpu"), verbose=False))
    if result.error is not None:
        raise result.error
    return result.pooch


@pytest.fixture(scope="module")
def bounds():
    return _train(16, {"profile_iters": PROFILE_ITERS, "policy": None}).profile


@pytest.mark.slow
@pytest.mark.parametrize("policy,fraction", [("pooch", 0.2), ("swap-all", 0.5),
                                             ("sqrt-n", 0.8), ("superneurons", 0.9)])
def test_measured_peak_is_the_predicted_peak_and_within_the_budget(bounds, policy, fraction):
    profile = bounds
    assert minimum_budget(profile) < profile.incore_peak_bytes
    budget = budget_between(profile, fraction)
    pooch = _train(16, {"profile_iters": PROFILE_ITERS, "policy": policy, "budget": budget})
    plan = pooch.plan
    assert plan is not None and plan.feasible, pooch.messages
    planned = pooch.iterations.iloc[PROFILE_ITERS:]
    measured = int(planned.peak_bytes.max())
    assert measured <= budget, (measured, budget)
    assert abs(plan.peak_bytes - measured) <= 0.05 * measured, (plan.peak_bytes, measured)
    assert pooch.overruns == []
    assert pooch.device.memory_source == "allocator"


def test_the_device_counts_what_the_graph_model_alone_misses():
    """im2col columns and Chainer's gradient bookkeeping are in the measured peak: more than
    the arrays the graph holds (the former tracked-arrays accounting)."""
    device = CpuDevice()
    try:
        x = np.ones((8, 16, 32, 32), np.float32)
        w = np.ones((16, 16, 3, 3), np.float32)
        device.reset_peak()
        F.convolution_2d(x, w, pad=1)
        columns = 8 * 16 * 9 * 32 * 32 * 4
        assert device.peak >= columns
    finally:
        device.restore()


def test_arrays_of_an_earlier_device_never_count():
    first = CpuDevice()
    kept = np.ones(1 << 20, np.uint8)        # allocated while the first device counts
    first.restore()
    second = CpuDevice()
    try:
        assert second.used_bytes() == 0
        del kept                              # freed while the second counts: not its bytes
        assert second.used_bytes() == 0
        fresh = np.ones(1000, np.uint8)
        assert second.used_bytes() == 1000
        del fresh
    finally:
        second.restore()


class _Recurrent(chainer.Chain):
    """A wide input layer, then one Linear shared by 12 steps: the input layer's weight
    gradient (1 MiB) is made by the last backward op, long after the peak at backward's start
    when the loop clears gradients."""

    def __init__(self, width: int = 256, steps: int = 12) -> None:
        super().__init__()
        self.steps = steps
        with self.init_scope():
            self.inp = L.Linear(1024, width)
            self.cell = L.Linear(width, width)
            self.out = L.Linear(width, 4)

    def forward(self, x):
        h = F.relu(self.inp(x))
        for _ in range(self.steps):
            h = F.tanh(self.cell(h))
        return self.out(h)


def _clear_after_forward(model, optimizer, x, t):     # what optimizer.update(lossfun) does
    optimizer.update(lambda: F.softmax_cross_entropy(model(x), t))


def _clear_before_forward(model, optimizer, x, t):
    model.cleargrads()
    F.softmax_cross_entropy(model(x), t).backward()
    optimizer.update()


def _zero_in_place(model, optimizer, x, t):            # gradients held all the time
    loss = F.softmax_cross_entropy(model(x), t)
    for param in model.params():
        if param.grad is not None:
            param.grad[...] = 0
    loss.backward()
    optimizer.update()


@pytest.mark.parametrize("step", [_clear_after_forward, _clear_before_forward, _zero_in_place])
def test_parameter_gradients_are_modelled_where_the_loop_holds_them(step):
    """The plan's predicted peak is the measured one within 2% whichever way the loop clears
    gradients (held through forward and remade in backward, made in backward only, or held
    throughout); counted as resident throughout, the first two over-predict by 6%."""
    np.random.seed(0)
    model = _Recurrent()
    optimizer = chainer.optimizers.MomentumSGD(0.01)
    optimizer.setup(model)
    rng = np.random.RandomState(1)
    with PoocH(model, profile_iters=PROFILE_ITERS, policy="pooch", verbose=False,
               device=CpuDevice(link="cpu")) as pooch:
        for _ in range(ITERS):     # each batch made in the loop, as a converter makes it: a
            x = rng.randn(64, 1024).astype(np.float32)        # dataset array made before the
            t = rng.randint(0, 4, 64).astype(np.int32)        # device began is never counted
            step(model, optimizer, x, t)
    plan = pooch.plan
    assert plan is not None and plan.feasible
    measured = int(pooch.iterations.iloc[PROFILE_ITERS:].peak_bytes.max())
    assert abs(plan.peak_bytes - measured) <= 0.02 * measured, (plan.peak_bytes, measured)
    cleared = pooch.profile.meta.get("cleared_gradients", {}).get("bytes", 0)
    params = sum(p.array.nbytes for p in model.params())
    assert cleared == (0 if step is _zero_in_place else params)
