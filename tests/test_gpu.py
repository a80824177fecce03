"""The CuPy path: copy streams and events, pinned buffers, recompute, the pool limit, exactness.

Marked ``gpu``: skipped where CUDA and CuPy are absent (conftest).
"""
from __future__ import annotations

import numpy as np
import pytest

import pooch_ext  # noqa: F401
import chainer
import chainer.functions as F

from pooch_ext.testing import (BranchyNet, make_optimizer, model_state, states_equal,
                                      synthetic_batches, train)
from pooch_ext.plan import Plan
from pooch_ext.sim.budgets import budget_between
from pooch_ext.sim.engine import simulate_plan

pytestmark = pytest.mark.gpu


@pytest.fixture
def cupy():
    import cupy
    return cupy


@pytest.fixture
def device(cupy):
    from pooch_ext.hooks.device import CupyDevice
    dev = CupyDevice()
    yield dev
    dev.restore()


def test_swap_out_sees_compute_queued_before_it_and_swap_in_round_trips(cupy, device):
    a = cupy.arange(1 << 20, dtype=cupy.float32)
    a *= 2                                        # queued on the compute stream
    transfer = device.swap_out(a, timed=True)     # must copy after the multiply
    device.finish_swap_out(transfer)
    host = transfer.host[1].view(np.float32)
    assert np.array_equal(host, 2 * np.arange(1 << 20, dtype=np.float32))
    b = device.swap_in(transfer, timed=True)
    device.wait_swap_in(transfer)
    b += 1                                        # compute after the wait sees the copy
    assert cupy.array_equal(b, a + 1)
    device.synchronize()
    out_s, in_s = device.transfer_seconds(transfer)
    assert out_s > 0 and in_s > 0


def test_layout_survives_and_pinned_buffers_are_reused(cupy, device):
    a = cupy.asfortranarray(cupy.random.rand(64, 33).astype(cupy.float32))
    first = device.swap_out(a)
    device.finish_swap_out(first)
    back = device.swap_in(first)
    device.wait_swap_in(first)
    assert back.flags.f_contiguous and cupy.array_equal(back, a)
    allocated = device.pinned.allocated_bytes
    device.discard(first)
    second = device.swap_out(a)                   # same size: the same pinned buffer
    assert device.pinned.allocated_bytes == allocated
    device.finish_swap_out(second)
    device.discard(second)


def test_recompute_rules_are_exact_on_the_gpu(cupy):
    from chainer.functions.normalization.batch_normalization import BatchNormalization
    from pooch_ext.hooks.recompute import recompute

    x = cupy.random.rand(4, 8, 6, 6).astype(cupy.float32)
    gamma = cupy.random.rand(8).astype(cupy.float32)
    beta = cupy.random.rand(8).astype(cupy.float32)
    mean, var = cupy.zeros(8, cupy.float32), cupy.ones(8, cupy.float32)
    node = BatchNormalization(mean=mean, var=var)
    y, = node.apply((x, gamma, beta))
    before = mean.copy()
    again, = recompute(node, (x, gamma, beta))
    assert cupy.array_equal(again, y.array) and cupy.array_equal(mean, before)


def _gpu_run(pooch, seed=0):
    import cupy
    np.random.seed(seed)
    cupy.random.seed(seed)
    model = BranchyNet()
    model.to_gpu()
    optimizer = make_optimizer(model, "momentum")
    result = train(model, optimizer, synthetic_batches(6, 4, (3, 16, 16), 5, xp=cupy), pooch)
    if result.error is not None:
        raise result.error
    return result, model_state(model, optimizer)


def _mixed(profile, budget, link):
    fms = profile.feature_maps
    classes = {int(t): (("keep", "swap", "recompute")[i % 3] if rc else ("keep", "swap")[i % 2])
               for i, (t, rc) in enumerate(zip(fms.tensor, fms.can_recompute))}
    plan = Plan("mixed", classes)
    return simulate_plan(profile, plan, link, budget)


def test_swap_and_recompute_plans_train_bit_identically_on_the_gpu():
    plain, plain_state = _gpu_run(None)
    for policy in ("swap-all", _mixed):
        result, state = _gpu_run({"profile_iters": 3, "policy": policy, "verbose": False})
        assert result.losses == plain.losses and states_equal(state, plain_state)
        assert result.pooch.profile.device.kind == "cuda"
        assert result.pooch.profile.link.name == "measured"
        executed = result.pooch.iterations.iloc[3:]
        assert (executed.on_demand == 0).all() and (executed.swap_outs > 0).all()


def test_the_budget_is_the_pool_limit_while_pooch_runs(cupy):
    import gc

    from pooch_ext.errors import BudgetTooSmallError
    from pooch_ext.pooch import PoocH

    pool = cupy.get_default_memory_pool()
    previous = pool.get_limit()
    probe, _ = _gpu_run({"profile_iters": 2, "policy": None, "verbose": False})
    profile = probe.pooch.profile
    del probe
    gc.collect()
    # blocks cached by earlier tests count against a pool limit (a cached block split between
    # a live and a free part cannot be released): start from an empty pool
    pool.free_all_blocks()
    # between the smallest plan and in-core, plus room for the pool's 512-byte rounding
    budget = budget_between(profile, 0.5) + (8 << 20)
    np.random.seed(0)
    cupy.random.seed(0)
    model = BranchyNet()
    model.to_gpu()
    optimizer = make_optimizer(model)
    limits = []
    with PoocH(model, profile_iters=2, policy="swap-all", budget=budget, verbose=False) as pooch:
        for x, t in synthetic_batches(5, 4, (3, 16, 16), 5, xp=cupy):
            loss = F.softmax_cross_entropy(model(x), t)
            model.cleargrads()
            loss.backward()
            optimizer.update()
            limits.append(pool.get_limit())
    assert limits[0] == previous and limits[-1] == budget   # iteration 0 runs unplanned
    assert pool.get_limit() == previous                      # given back at exit
    assert (pooch.iterations.peak_bytes.iloc[2:] <= budget).all()
    with pytest.raises(BudgetTooSmallError):
        _gpu_run({"profile_iters": 2, "policy": "swap-all", "budget": 1 << 10, "verbose": False})
    assert pool.get_limit() == previous


def test_forward_ops_still_run_on_the_current_stream(cupy):
    """Compute stays on the caller's stream; copies go to PoocH's own non-blocking streams."""
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        plain, plain_state = _gpu_run(None)
        result, state = _gpu_run({"profile_iters": 2, "policy": "swap-all", "verbose": False})
    assert result.losses == plain.losses and states_equal(state, plain_state)
    x = cupy.ones((2, 3), cupy.float32)
    assert float(F.sum(chainer.Variable(x)).array) == 6.0


def test_a_transposed_map_is_swapped_as_it_lies_and_comes_back_with_its_strides(cupy, device):
    """Chainer's im2col convolution returns a rollaxis view: no relayout copy, same strides."""
    y = cupy.rollaxis(cupy.random.rand(4, 5, 6, 3).astype(cupy.float32), 3, 1)
    assert not y.flags.c_contiguous
    transfer = device.swap_out(y)
    device.finish_swap_out(transfer)
    back = device.swap_in(transfer)
    device.wait_swap_in(transfer)
    assert back.strides == y.strides and cupy.array_equal(back, y) and device.relayouts == 0


def _copy_times(device, data):
    """(d2h s, h2d s, the array back) of the second of two round trips (the first warms up)."""
    from pooch_ext.hooks.device import round_trip

    round_trip(device, data)
    return round_trip(device, data)


def test_throttled_copies_take_the_emulated_links_time_and_stay_exact(cupy, device):
    from pooch_ext.hooks.device import CupyDevice
    from pooch_ext.hooks.linkemu import copy_s

    data = cupy.arange(16 << 20, dtype=cupy.float32)           # 64 MiB
    native = _copy_times(device, data)
    targets = copy_s("pcie3", "d2h", data.nbytes), copy_s("pcie3", "h2d", data.nbytes)
    if native[0] > targets[0] or native[1] > targets[1]:
        pytest.skip(f"this host link is slower than pcie3 ({native[:2]} s for 64 MiB)")
    throttled = CupyDevice(throttle="pcie3")
    try:
        out_s, in_s, back = _copy_times(throttled, data)
    finally:
        throttled.restore()
    assert cupy.array_equal(back, data)
    assert out_s == pytest.approx(targets[0], rel=0.1)
    assert in_s == pytest.approx(targets[1], rel=0.1)


def test_the_pool_peak_hook_sees_temporaries_inside_an_op(cupy):
    from pooch_ext.hooks.pool_peak import pool_peak_hook

    hook = pool_peak_hook(cupy)
    with hook:
        hook.reset()
        base = hook.peak
        temporary = cupy.empty(8 << 20, cupy.uint8)
        del temporary
    assert hook.peak - base >= 8 << 20


def test_relu_backward_from_a_binarized_mask_gives_chainers_bits_on_the_gpu(cupy):
    from tests.test_encodings import relu_grads_with_and_without_the_mask
    plain, masked = relu_grads_with_and_without_the_mask(cupy)
    assert masked.dtype == plain.dtype and masked.tobytes() == plain.tobytes()


def test_in_place_relu_gives_chainers_bits_on_the_gpu(cupy):
    """The in-place ReLU runs cupy.maximum; Chainer's default on a GPU is cuDNN's
    activation: forward values and gradients must still agree to the bit."""
    from tests.test_inplace import relu_with_and_without_writing_over
    plain, over = relu_with_and_without_writing_over(cupy)
    assert plain == over
