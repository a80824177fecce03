"""The host-simulated device: accounting of held buffers, the budget, swaps to the host store."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer
import chainer.links as L

from pooch_ext.hooks.allocator import AllocationLog, scratch_bytes
from pooch_ext.hooks.device import DeviceOutOfMemoryError, HostSimDevice, device_for
from pooch_ext.units import UNLIMITED
from pooch_ext.hooks.model_state import resident_bytes
from pooch_ext.testing import BranchyNet, make_optimizer
from pooch_ext.links import get_link


def test_accounting_counts_each_buffer_once_and_follows_python_frees():
    device = HostSimDevice(measure=False)
    a = np.zeros(1000, np.float32)
    view = a.reshape(10, 100)
    device.track(a)
    device.track(view)                 # a view of a counted buffer adds nothing
    assert device.used_bytes() == 4000
    b = np.zeros(10, np.float64)
    device.track(b)
    assert device.used_bytes() == 4080
    del a
    assert device.used_bytes() == 4080  # the view still holds the buffer
    del view
    gc.collect()
    assert device.used_bytes() == 80
    device.resident = 20
    assert device.used_bytes() == 100


def test_budget_is_enforced_with_a_clear_error_and_no_budget_means_no_limit():
    device = HostSimDevice(budget=1000, measure=False)
    keep = np.zeros(200, np.float32)   # 800 bytes
    device.track(keep)
    device.check("op 3 (ReLU)")
    assert device.peak == 800
    more = np.zeros(100, np.float32)
    device.track(more)
    with pytest.raises(DeviceOutOfMemoryError, match=r"op 4 \(Concat\).*budget 1000 B"):
        device.check("op 4 (Concat)")
    unlimited = HostSimDevice(measure=False)
    unlimited.track(np.zeros(10**6, np.uint8))
    unlimited.check()
    assert unlimited.capacity_bytes() == UNLIMITED and HostSimDevice(budget=5).capacity_bytes() == 5


def test_swap_round_trip_keeps_values_and_layout_and_takes_at_least_the_links_time():
    link = get_link("pcie3")
    device = HostSimDevice(link=link)
    source = np.asfortranarray(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    transfer = device.swap_out(source)
    assert transfer.host is not source and device.host_bytes == source.nbytes
    device.finish_swap_out(transfer)
    back = device.swap_in(transfer)
    device.wait_swap_in(transfer)
    assert np.array_equal(back, source) and back.flags.f_contiguous and back is not source
    out_s, in_s = device.transfer_seconds(transfer)      # at least the link's time, measured
    assert out_s >= link.swap_out_s(96) and in_s >= link.swap_in_s(96)
    device.discard(transfer)
    assert device.host_bytes == 0 and transfer.host is None
    with pytest.raises(Exception, match="discarded"):
        device.swap_in(transfer)


def test_allocation_events_reach_the_listener_and_scratch_is_measured_per_op():
    log = AllocationLog()
    log.enabled = True
    device = HostSimDevice(measure=False)
    device.listener = log.record
    log.op = 7
    scratch = np.zeros(64, np.uint8)
    device.track(scratch, tensor=-1)
    output = np.zeros(16, np.uint8)
    device.track(output, tensor=3)
    del scratch
    gc.collect()
    log.op = -1
    kinds = [(e[1], e[2], e[3]) for e in log.events]
    assert kinds == [(7, "malloc", 64), (7, "malloc", 16), (7, "free", 64)]
    assert scratch_bytes(log.events) == {7: 64}
    assert output.nbytes == 16


def test_scratch_pairs_blocks_by_key_even_when_a_pointer_is_reused():
    events = [(0, 2, "malloc", 100, -1, 1), (1, 2, "malloc", 50, -1, 2), (2, 2, "free", 100, -1, 1),
              (3, 2, "malloc", 100, -1, 1),                      # same pointer, kept: an output
              (4, 5, "malloc", 30, -1, 9), (5, 5, "free", 30, -1, 9), (6, -1, "malloc", 8, -1, 4)]
    assert scratch_bytes(events) == {2: 100, 5: 30}


def test_resident_bytes_counts_parameters_gradients_persistents_and_optimizer_state():
    model = BranchyNet()
    x = np.zeros((2, 3, 16, 16), np.float32)
    model(x)                                  # Linear(None, ...) initializes lazily
    params = sum(p.array.nbytes for p in model.params())
    persistents = sum(getattr(link, n).nbytes for link in model.links() for n in link._persistent
                      if hasattr(getattr(link, n), "nbytes"))
    assert resident_bytes(model) == 2 * params + persistents
    optimizer = make_optimizer(model, "momentum")
    for p in model.params():
        p.grad = np.zeros_like(p.array)
    optimizer.update()                        # creates the velocity state
    assert resident_bytes(model) == 3 * params + persistents


def test_resident_bytes_count_no_optimizer_state_a_disabled_rule_never_makes():
    """A frozen link (``disable_update()``) keeps its gradients (Chainer computes them, and
    the update fills missing ones with zeros) but its rule makes no state: Adam's two moments
    of a frozen backbone had counted, refusing a fine-tuning run at twice what it holds."""
    np.random.seed(0)
    model = chainer.Sequential(L.Linear(8, 16), L.Linear(16, 4))
    optimizer = chainer.optimizers.Adam()
    optimizer.setup(model)
    model[0].disable_update()
    frozen = sum(p.array.nbytes for p in model[0].params())
    trained = sum(p.array.nbytes for p in model[1].params())
    assert resident_bytes(model) == 2 * (frozen + trained) + 2 * trained
    loss = chainer.functions.sum(model(np.ones((2, 8), np.float32)))
    model.cleargrads()
    loss.backward()
    optimizer.update()
    assert all(not p.update_rule.state for p in model[0].params())
    assert resident_bytes(model) == 2 * (frozen + trained) + 2 * trained


def test_a_model_on_the_host_gets_the_host_simulated_device():
    device = device_for(BranchyNet(), budget=12345, link="nvlink2")
    assert isinstance(device, HostSimDevice)
    assert device.budget == 12345 and device.link.name == "nvlink2"


def test_both_devices_meet_the_runtime_device_interface():
    """Every member the runtime may use, on the CPU device (an instance) and on the CuPy device
    (its class and the attributes its __init__ sets: it cannot be built without CUDA)."""
    import inspect

    from pooch_ext.hooks.cpu_device import CpuDevice
    from pooch_ext.hooks.device import CupyDevice
    from pooch_ext.hooks.runtime_device import RuntimeDevice

    members = {name for name in vars(RuntimeDevice) if not name.startswith("_")} | \
        set(RuntimeDevice.__annotations__)
    assert {"swap_out", "swap_in", "check", "kind", "peak"} <= members
    assert isinstance(CpuDevice(measure=False), RuntimeDevice)
    init = inspect.getsource(CupyDevice.__init__)
    missing = [m for m in members if not hasattr(CupyDevice, m) and f"self.{m} =" not in init
               and f"self.{m}:" not in init]
    assert missing == []
