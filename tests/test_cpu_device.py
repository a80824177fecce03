"""The CPU device behaves like a GPU in everything but speed: asynchronous copy engines with
stream order and events, exact layouts, exact-size reusable host buffers, measured memory."""
from __future__ import annotations

import threading
import time
import weakref

import numpy as np
import pytest

import pooch_ext  # noqa: F401
from pooch_ext.hooks import cpu_memory
from pooch_ext.hooks.cpu_device import CopyEngine, CpuDevice
from pooch_ext.testing import (BranchyNet, make_optimizer, model_state, states_equal,
                                      synthetic_batches, train)


def test_a_swap_out_returns_before_its_copy_lands_and_copies_keep_their_order():
    device = CpuDevice(copy_delay_s=0.05)
    arrays = [np.full(1000, k, np.float32) for k in range(3)]
    started = time.perf_counter()
    transfers = [device.swap_out(a) for a in arrays]
    assert time.perf_counter() - started < 0.05           # queued, not copied
    assert not transfers[0].events["out_done"].is_set()
    device.finish_swap_out(transfers[1])                   # waits for the one before it too
    assert transfers[0].events["out_done"].is_set()
    assert transfers[0].source is not None and transfers[1].source is None
    device.synchronize()
    assert all(t.events["out_done"].is_set() for t in transfers)
    device.restore()


def test_a_swap_in_is_not_there_until_it_is_waited_for():
    """``poison`` fills a swap-in's array with NaN until its copy lands: reading it early
    shows, which is how the executor's waits are checked below."""
    device = CpuDevice(copy_delay_s=0.05, poison=True)
    source = np.arange(256, dtype=np.float32)
    transfer = device.swap_out(source)
    device.finish_swap_out(transfer)
    back = device.swap_in(transfer)
    assert np.isnan(back).all()                            # the copy is still on its way
    device.wait_swap_in(transfer)
    assert np.array_equal(back, source)
    device.restore()


def test_a_swap_in_copies_after_the_swap_out_of_the_same_map():
    device = CpuDevice(copy_delay_s=0.05)
    source = np.arange(64, dtype=np.float64)
    transfer = device.swap_out(source)                     # not waited for
    back = device.swap_in(transfer)                        # queued on the other engine
    device.wait_swap_in(transfer)
    assert np.array_equal(back, source)
    device.restore()


def test_a_discarded_swap_out_lets_go_of_the_device_array_at_once():
    """A copy given up while queued (its map swapped again, a forward-only pass over) must
    not keep the device array until the engine gets to it: on a GPU that memory is the
    pool's again at once. The copy still takes its time on the engine."""
    device = CpuDevice(copy_delay_s=0.05)
    source = np.ones(1000, np.float32)
    alive = weakref.ref(source)
    busy = device.swap_out(np.zeros(10, np.float32))      # the engine is on this one
    transfer = device.swap_out(source)
    device.discard(transfer)
    del source
    assert alive() is None and transfer.source is None
    device.finish_swap_out(busy)
    device.synchronize()
    assert transfer.events["out_done"].is_set()
    device.restore()


def test_host_buffers_are_exact_size_and_reused():
    device = CpuDevice()
    odd = np.ones(1000 + 3, np.uint8)
    first = device.swap_out(odd)
    device.finish_swap_out(first)
    assert device.host_bytes == odd.nbytes and device.host.allocated == odd.nbytes
    buffer = first.events["buffer"]
    device.discard(first)
    assert device.host_bytes == 0
    second = device.swap_out(np.zeros(1003, np.uint8))
    assert second.events["buffer"] is buffer and device.host.allocated == 1003
    device.restore()


def test_copies_and_compute_run_at_once():
    """Copy engines are threads; while a copy runs (here: held by a long emulated link),
    the main thread computes. Overlap is shown with numbers by experiments/bench_overlap.py."""
    engine = CopyEngine("d2h", lambda n: 0.2)
    destination, source = np.empty(10), np.ones(10)
    started = time.perf_counter()
    done, _, _ = engine.submit(destination, source, source.nbytes)
    work = sum(float(np.dot(np.ones(200), np.ones(200))) for _ in range(100))
    assert work == 100 * 200.0 and not done.is_set()      # computing while the copy runs
    done.wait()
    assert time.perf_counter() - started >= 0.2
    engine.close()


@pytest.mark.parametrize("policy", ["swap-all", "pooch", "superneurons"])
def test_training_is_exact_with_slow_copies_that_poison_what_has_not_landed(policy):
    """Copies held back 2 ms each, arrays NaN until they land: any read before the schedule's
    wait (or an on-demand restore's) would change the losses."""
    batches = synthetic_batches(5, 4, (3, 16, 16), 5)

    def run(pooch):
        np.random.seed(0)
        model = BranchyNet()
        optimizer = make_optimizer(model)
        result = train(model, optimizer, batches, pooch)
        return result, model_state(model, optimizer)
    plain, plain_state = run(None)
    device = CpuDevice(copy_delay_s=0.002, poison=True)
    result, state = run({"profile_iters": 2, "policy": policy, "device": device,
                         "verbose": False})
    assert result.error is None, result.error
    assert result.losses == plain.losses and states_equal(state, plain_state)
    runs = result.pooch.iterations
    assert runs.swap_ins.sum() > 0


@pytest.fixture
def counting():
    """The counting allocator, on in this context for the test (skipped where it cannot be
    built), off again after."""
    counter = cpu_memory.counter()
    if counter is None:
        pytest.skip(f"no C compiler here: {cpu_memory.failure}")
    was = counter.use(True)
    try:
        yield counter
    finally:
        counter.use(was)


def test_the_counting_allocator_sees_temporaries_inside_an_op(counting):
    import chainer.functions as F

    x = np.random.rand(4, 3, 16, 16).astype(np.float32)
    w = np.random.rand(8, 3, 3, 3).astype(np.float32)
    counting.reset_peak()
    before = counting.live()
    y = F.convolution_2d(x, w, pad=1)
    grown = counting.live() - before
    peak = counting.peak() - before
    assert grown >= y.array.nbytes
    columns = x.nbytes * 9                              # im2col's buffer
    assert peak >= grown + columns


def test_memory_counted_in_another_thread_is_not_device_memory(counting):
    before = counting.live()
    kept = []
    worker = threading.Thread(target=lambda: kept.append(np.ones(10**5)))
    worker.start()
    worker.join()
    assert counting.live() == before                     # a thread's own context
    here = np.ones(10**5)
    assert counting.live() - before >= here.nbytes


@pytest.mark.parametrize("measure", [True, False])
def test_device_bytes_follow_a_map_out_and_back(measure):
    """A map swapped out and released leaves the device's count (its host copy is host
    memory); swapped back in, the count is what it was; discarding the host copy frees the
    host bytes. With the allocator (``measure``) or counting tracked arrays."""
    if measure and cpu_memory.counter() is None:
        pytest.skip(f"no C compiler here: {cpu_memory.failure}")
    device = CpuDevice(measure=measure)
    try:
        fmap = np.arange(1 << 16, dtype=np.float32)
        device.track(fmap)
        before = device.used_bytes()
        assert before >= fmap.nbytes
        transfer = device.swap_out(fmap)
        device.finish_swap_out(transfer)
        del fmap
        assert device.used_bytes() == before - (1 << 18)
        assert device.host_bytes == 1 << 18
        back = device.swap_in(transfer)
        device.track(back)
        device.wait_swap_in(transfer)
        assert device.used_bytes() == before
        assert np.array_equal(back, np.arange(1 << 16, dtype=np.float32))
        device.discard(transfer)
        assert device.host_bytes == 0 and device.used_bytes() == before
        del back
        assert device.used_bytes() == before - (1 << 18)
    finally:
        device.restore()
