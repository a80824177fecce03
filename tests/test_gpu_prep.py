"""CPU tests of what the GPU session relies on: link emulation (the delay per copy, the
host-simulated analogue, the stamp/hold kernels around each copy), layout-exact swaps on the
CuPy device (driven through a small functional stand-in for CuPy), and measure.py's whole
logic in its ``--cpu --tiny`` mode, through run_all.sh as the GPU session will call it."""
from __future__ import annotations

import ctypes
import itertools
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from pooch_ext.hooks import linkemu
from pooch_ext.hooks.device import CupyDevice, HostSimDevice, dense_layout, round_trip
from pooch_ext.hooks.pool_peak import pool_peak_hook
from pooch_ext.links import get_link

ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20


# ---------------------------------------------------------------------------------- delays

def test_a_copy_is_stretched_to_the_target_link_and_never_shortened():
    pcie3, c2c = get_link("pcie3"), get_link("c2c")
    n = 64 * MiB
    native = linkemu.copy_s(c2c, "d2h", n)
    target = linkemu.copy_s(pcie3, "d2h", n)
    assert target == pytest.approx(pcie3.latency_s + n / 12e9)
    assert linkemu.extra_s(native, target) == pytest.approx(target - native)
    assert linkemu.stretched_s(native, target) == pytest.approx(target)
    # a native copy already slower than the target is left alone
    assert linkemu.extra_s(target, native) == 0.0
    assert linkemu.stretched_s(target, native) == target
    assert linkemu.target_ns("pcie3", "h2d", n) == round(target * 1e9)
    with pytest.raises(ValueError, match="direction"):
        linkemu.copy_s("pcie3", "sideways", n)


def test_the_emulated_link_is_the_slower_one_per_direction():
    fast_out = get_link("pcie5").__class__("odd", 80e9, 5e9, 2e-6)
    link = linkemu.emulated_link(fast_out, "pcie3")
    assert (link.d2h_bytes_per_s, link.h2d_bytes_per_s) == (12e9, 5e9)
    assert link.latency_s == get_link("pcie3").latency_s
    assert linkemu.emulated_link("pcie5", "pcie3") == get_link("pcie3")


def test_host_simulated_throttle_times_copies_like_the_target_and_plans_with_it():
    n = 8 * MiB
    plain = HostSimDevice(link="pcie5")
    throttled = HostSimDevice(link="pcie5", throttle="pcie3")
    a = np.arange(n // 4, dtype=np.float32)
    for device, link in ((plain, "pcie5"), (throttled, "pcie3")):
        out_s, in_s, back = round_trip(device, a)       # the CPU device's copy engines
        assert np.array_equal(back, a)
        assert out_s >= linkemu.copy_s(link, "d2h", n) and in_s >= linkemu.copy_s(link, "h2d", n)
        device.restore()
    assert throttled.link == get_link("pcie3") and plain.link == get_link("pcie5")
    # throttling to a faster link changes nothing
    faster = HostSimDevice(link="pcie3", throttle="c2c").link
    assert (faster.d2h_bytes_per_s, faster.h2d_bytes_per_s) == (12e9, 12e9)


# ---------------------------------------------------------------------------------- layouts

@pytest.mark.parametrize("make, dense", [
    (lambda a: a, True),                                   # C
    (lambda a: np.asfortranarray(a), True),                # F
    (lambda a: np.rollaxis(a, 3, 1), True),                # Chainer's im2col convolution output
    (lambda a: a.transpose(2, 0, 3, 1), True),
    (lambda a: a[:, :2], False),                           # a strided slice
    (lambda a: a[::-1], False),                            # negative strides
    (lambda a: a[:, :, :1, :], False),
    (lambda a: a[:, :0], True),                            # empty
    (lambda a: a[:1], True),                               # a length-1 axis, any stride
])
def test_dense_layout(make, dense):
    array = make(np.zeros((2, 3, 4, 5), np.float32))
    assert dense_layout(array.shape, array.strides, array.itemsize) is dense


# ---------------------------------------------------------------------------------- fake CuPy

class _Pointer:
    """MemoryPointer: the address of an array's first element, with the two async copies."""

    def __init__(self, array: "_DevArray", log: list) -> None:
        self.array, self.log = array, log

    def copy_to_host_async(self, dst, size, stream):
        self.log.append(("copy", stream.name, size))
        ctypes.memmove(dst.value, self.array.a.ctypes.data, size)

    def copy_from_host_async(self, src, size, stream):
        self.log.append(("copy", stream.name, size))
        ctypes.memmove(self.array.a.ctypes.data, src.value, size)


class _DevArray:
    """A 'device' array: a NumPy array that is not a NumPy array (so nothing converts it)."""

    def __init__(self, a: np.ndarray, log: list) -> None:
        self.a, self.log = a, log
        for name in ("shape", "strides", "itemsize", "nbytes", "dtype", "flags"):
            setattr(self, name, getattr(a, name))

    def __getitem__(self, key) -> "_DevArray":
        return _DevArray(self.a[key], self.log)

    @property
    def data(self) -> _Pointer:
        return _Pointer(self, self.log)


class _Stream:
    def __init__(self, fake, name):
        self.fake, self.name = fake, name

    def __enter__(self):
        self.fake.current.append(self)

    def __exit__(self, *exc):
        self.fake.current.pop()

    def wait_event(self, event):
        self.fake.log.append(("wait", self.name))

    def synchronize(self):
        pass


class _FakeCupy:
    """Just what CupyDevice and CopyThrottle touch, recording launches and copies in order."""

    def __init__(self):
        self.log, self.current = [], []
        compute = _Stream(self, "compute")
        self.current.append(compute)
        streams = itertools.cycle(("d2h", "h2d"))      # two per device
        self.limit = 0
        pool = SimpleNamespace(get_limit=lambda: self.limit,
                               set_limit=lambda size: setattr(self, "limit", size),
                               used_bytes=lambda: self.used, total_bytes=lambda: self.used,
                               free_all_blocks=lambda: None)
        fake = self

        class Event:
            def __init__(self, disable_timing=True):
                pass

            def record(self, stream=None):
                fake.log.append(("event", stream.name))

            def synchronize(self):
                pass

        def alloc(nbytes):
            return SimpleNamespace(buf=bytearray(nbytes))

        class MemoryHook:
            """CuPy's rule: entered hooks are keyed by ``name``; a second of one name fails."""
            name = "MemoryHook"

            def __enter__(self):
                if self.name in fake.hooks:
                    raise KeyError(f"memory hook {self.name} already exists")
                fake.hooks[self.name] = self
                return self

            def __exit__(self, *exc):
                del fake.hooks[self.name]

        self.cuda = SimpleNamespace(
            Device=lambda: SimpleNamespace(id=0, synchronize=lambda: None),
            runtime=SimpleNamespace(getDeviceProperties=lambda i: {"name": b"fake GPU"},
                                    memGetInfo=lambda: (1 << 30, 1 << 30)),
            Stream=lambda non_blocking, priority=None: _Stream(self, next(streams)),
            Event=Event, get_current_stream=lambda: self.current[-1],
            alloc_pinned_memory=lambda n: bytearray(n), alloc=alloc, MemoryHook=MemoryHook,
            get_allocator=lambda: self.allocator,
            set_allocator=lambda f: setattr(self, "allocator", f))
        self.allocator = "the pool's"
        self.get_default_memory_pool = lambda: pool
        self.hooks: dict = {}
        self.used = 0

    def malloc(self, nbytes):
        """An allocation as CuPy reports it to the entered hooks."""
        self.used += nbytes
        for hook in list(self.hooks.values()):
            hook.malloc_postprocess(size=nbytes)

    def zeros(self, n, dtype):
        return _DevArray(np.zeros(n, dtype), self.log)

    def RawKernel(self, code, name):   # noqa: N802 (CuPy's name)
        assert name in code
        return lambda grid, block, args: self.log.append(
            (name, self.current[-1].name, int(args[1]) if len(args) > 1 else None))

    def ndarray(self, shape, dtype, memptr, strides):
        return _DevArray(np.ndarray(shape, dtype, buffer=memptr.buf, strides=strides), self.log)

    def empty(self, shape, dtype, order="C"):
        return _DevArray(np.empty(shape, dtype, order=order), self.log)

    def ascontiguousarray(self, array):
        self.log.append(("relayout", self.current[-1].name, array.nbytes))
        return _DevArray(np.ascontiguousarray(array.a), self.log)


@pytest.fixture
def fake_cupy(monkeypatch):
    fake = _FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    return fake


def _round_trip(device, array):
    transfer = device.swap_out(array)
    device.finish_swap_out(transfer)
    back = device.swap_in(transfer)
    device.wait_swap_in(transfer)
    return transfer, back


def test_a_transposed_map_comes_back_with_its_strides_and_bytes_without_a_relayout(fake_cupy):
    device = CupyDevice()
    y = np.rollaxis(np.random.RandomState(0).rand(2, 5, 6, 3).astype(np.float32), 3, 1)
    transfer, back = _round_trip(device, _DevArray(y, fake_cupy.log))
    assert back.strides == y.strides and back.shape == y.shape
    assert np.array_equal(back.a, y) and not back.a.flags.c_contiguous
    assert device.relayouts == 0 and not any(e[0] == "relayout" for e in fake_cupy.log)
    # a strided slice is made contiguous first (counted), and still comes back equal
    sliced = np.arange(60, dtype=np.float32).reshape(6, 10)[:, :4]
    transfer, back = _round_trip(device, _DevArray(sliced, fake_cupy.log))
    assert device.relayouts == 1 and np.array_equal(back.a, sliced) and back.a.flags.c_contiguous


def test_pool_peak_hooks_nest_as_a_run_around_the_split_measurement_needs(fake_cupy):
    """A run's pool hook stays entered while conv_configs measures a split's scratch with its
    own: CuPy refuses a second hook of one name, which failed every budgeted run on the
    first GPU that measured splits on demand (2026-11-27, H200)."""
    from pooch_ext.hooks.conv_configs import PoolCounter
    run_hook, counter = pool_peak_hook(fake_cupy), PoolCounter(fake_cupy)
    with run_hook:
        fake_cupy.malloc(100)
        with counter.hook:
            counter.reset_peak()
            fake_cupy.malloc(50)
        fake_cupy.malloc(10)
    assert (run_hook.peak, counter.peak()) == (160, 150)
    assert not fake_cupy.hooks


def test_the_cupy_device_peak_counts_what_an_op_held_between_boundaries(fake_cupy):
    """On the first GPU run of the demo the op-boundary peak said 16.4 MiB for a plan whose
    im2col columns made it 46.8 MiB: the device's peak is the pool's, inside ops too."""
    device = CupyDevice()
    fake_cupy.malloc(30)
    device.reset_peak()
    assert device.peak == 30 and len(fake_cupy.hooks) == 1
    fake_cupy.malloc(100)               # an op's scratch ...
    fake_cupy.used -= 100               # ... freed before its end
    device.check("after the op")
    assert device.peak == 130
    device.reset_peak()
    assert device.peak == 30
    device.restore()
    assert not fake_cupy.hooks and device.peak == 30


def test_a_split_measurement_runs_outside_the_budget_and_the_peak_on_the_gpu(fake_cupy,
                                                                          monkeypatch):
    """Measuring a split runs the whole op on probes: under the pool's limit ResNet-50 b256's
    measurement asked for a 144 MiB column buffer a 405 MiB budget had no room for (H200).
    The CPU device counts it apart; the CuPy device lifts the limit and hides it from the
    peak."""
    from pooch_ext.hooks import conv_configs
    device = CupyDevice(arena=True)
    device.set_budget(1000)
    device.reset_peak()
    fake_cupy.malloc(300)
    seen = []

    def measure(call, xp, counter=None, repeats=2, parts=conv_configs.PARTS):
        seen.append(fake_cupy.limit)
        assert device.arena._away()         # nor is it the arena's to learn or serve
        fake_cupy.malloc(5000)              # probes and the whole op's scratch
        fake_cupy.used -= 5000
        return [], []

    monkeypatch.setattr(conv_configs, "measure", measure)
    monkeypatch.setattr(conv_configs, "_MEASURED", {})
    call = conv_configs.ConvCall((1, 1), (1, 1), (1, 1), False, ((2, 3, 8, 8), (), "<f4"),
                                 ((4, 3, 3, 3), (), "<f4"), None, True)
    conv_configs.measured_configs(call, device)
    assert seen == [0] and fake_cupy.limit == 1000
    assert device.peak == 300
    device.restore()


def test_work_apart_gives_cached_blocks_back_only_where_the_pool_went_past_its_limit(
        fake_cupy):
    """A block cached past the limit would serve later requests the limit never checks (the
    71.4 MiB peak in a 47.5 MiB budget, H200); within the limit the cache stays, so the
    profiler's reruns of every op do not send the iteration's blocks back to the driver."""
    freed = []
    pool = fake_cupy.get_default_memory_pool()
    pool.free_all_blocks = lambda: freed.append(fake_cupy.used)
    device = CupyDevice()
    device.set_budget(1000)
    freed.clear()
    for held in (600, 1400):
        with device.apart():
            assert fake_cupy.limit == 0
            fake_cupy.used = held            # the pool's total when the work apart ends
        assert fake_cupy.limit == 1000
    assert freed == [1400]
    device.restore()


def test_work_on_the_host_side_such_as_plain_chainer_beside_pooch_is_outside_the_budget(
        fake_cupy):
    """The demo runs plain Chainer beside PoocH in one process (``testing.hooks_out``): on
    the CPU device its arrays are uncounted, on the CuPy device they had run under the
    pool's limit, the plain model's whole in-core need inside PoocH's budget. ``host_side``
    is now ``apart`` there: the limit lifted, the peak kept, put back after."""
    device = CupyDevice()
    device.set_budget(1000)
    device.reset_peak()
    fake_cupy.malloc(300)
    with device.host_side():
        assert fake_cupy.limit == 0
        fake_cupy.malloc(5000)               # the plain model's iteration
        fake_cupy.used -= 5000
    assert fake_cupy.limit == 1000 and device.peak == 300
    device.restore()


def test_a_pool_headroom_lets_the_pool_take_more_than_the_budget_the_plan_holds(
        fake_cupy, monkeypatch):
    """The diagnostic that measures a GPU plan past the pool's fragmentation: the budget is
    what the plan is made for, the pool's limit that times the headroom."""
    monkeypatch.delenv("POOCH_GPU_POOL_HEADROOM", raising=False)
    device = CupyDevice()
    device.set_budget(1000)
    assert (device.budget, fake_cupy.limit) == (1000, 1000)
    device.restore()
    monkeypatch.setenv("POOCH_GPU_POOL_HEADROOM", "1.5")
    device = CupyDevice()
    device.set_budget(1000)
    assert (device.budget, fake_cupy.limit) == (1000, 1500)
    device.restore()
    for bad in ("0.9", "nan", "inf", "lots", ""):
        monkeypatch.setenv("POOCH_GPU_POOL_HEADROOM", bad)
        with pytest.raises(ValueError, match="POOCH_GPU_POOL_HEADROOM"):
            CupyDevice()


def test_the_arena_is_opt_in_and_is_cupys_allocator_only_while_pooch_runs(fake_cupy,
                                                                         monkeypatch):
    monkeypatch.delenv("POOCH_GPU_ARENA", raising=False)
    assert CupyDevice().arena is None
    monkeypatch.setenv("POOCH_GPU_ARENA", "1")
    device = CupyDevice()
    assert device.arena is not None and CupyDevice(arena=False).arena is None
    device.set_budget(1000)
    assert fake_cupy.allocator == device.arena.malloc
    device.reset_peak()                     # an iteration begins: the arena learns the last
    assert device.arena.plan._last == []
    device.restore()
    assert fake_cupy.allocator == "the pool's"


def test_fidelity_builds_the_cupy_device_for_the_gpu_own_link_and_the_cpu_device_else(
        fake_cupy):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    import fidelity
    from pooch_ext.hooks.cpu_device import CpuDevice
    device, sync, hook = fidelity._device(None, fake_cupy)
    assert isinstance(device, CupyDevice) and device.throttle is None and hook is not None
    device, sync, hook = fidelity._device("cpu", None)
    assert isinstance(device, CpuDevice) and (sync, hook) == (None, None)
    device.restore()


def test_throttled_copies_are_bracketed_by_the_stamp_and_hold_kernels(fake_cupy):
    device = CupyDevice(throttle="pcie3")
    array = _DevArray(np.ones(3 * MiB // 4, np.float32), fake_cupy.log)
    start = len(fake_cupy.log)
    transfer, back = _round_trip(device, array)
    steps = [e for e in fake_cupy.log[start:] if e[0] != "event" and e[0] != "wait"]
    n = array.nbytes
    assert steps == [("pooch_link_stamp", "d2h", None), ("copy", "d2h", n),
                     ("pooch_link_hold", "d2h", linkemu.target_ns("pcie3", "d2h", n)),
                     ("pooch_link_stamp", "h2d", None), ("copy", "h2d", n),
                     ("pooch_link_hold", "h2d", linkemu.target_ns("pcie3", "h2d", n))]
    assert np.array_equal(back.a, array.a) and device.throttle.copies == 2
    # the copy's done event comes after the hold: whoever waits on it waits for the stretch
    d2h = [e for e in fake_cupy.log[start:] if e[1:2] == ("d2h",)]
    assert d2h[-2][0] == "pooch_link_hold" and d2h[-1][0] == "event"


def test_unthrottled_copies_launch_no_kernels(fake_cupy):
    device = CupyDevice()
    _round_trip(device, _DevArray(np.ones(1024, np.float32), fake_cupy.log))
    assert not [e for e in fake_cupy.log if e[0].startswith("pooch_link")]


# ---------------------------------------------------------------------------------- run_all

@pytest.fixture(scope="module")
def run_all_cpu(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_out")
    # 400 s of budget leave the GPU-test step ~100 s: collecting the suite on a busy machine
    # took longer than the 5 s a 300 s budget left it
    env = dict(os.environ, PYTHON=sys.executable, POOCH_INSTALL="0", POOCH_GPU_BUDGET_S="400")
    done = subprocess.run(["bash", str(ROOT / "experiments/gpu/run_all.sh"), str(out), "--cpu"],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, done.stdout


@pytest.mark.slow
def test_run_all_returns_at_most_eight_plain_files_with_every_result(run_all_cpu):
    out, stdout = run_all_cpu
    files = sorted(p.name for p in out.iterdir())
    assert all(p.is_file() for p in out.iterdir()) and len(files) <= 8
    assert set(files) == {"results.tar.gz", "runs.csv", "targets.csv", "profiles.csv",
                          "link.csv", "measure.log", "pytest-gpu.log", "env.txt"}
    with tarfile.open(out / "results.tar.gz") as tar:
        names = tar.getnames()
    for name in ("work/throughput.png", "work/fidelity.png", "work/link.png",
                 "work/environment.json", "work/profiles/small-resnet_b8_native/ops.csv",
                 "work/profiles/small-resnet_b8_pcie3-emulated/ops.csv"):
        assert name in names
    assert "skipped" in (out / "pytest-gpu.log").read_text()     # gpu tests skip without CUDA
    assert "measure.py exit 0" in stdout


@pytest.mark.slow
def test_measure_rows_hold_predictions_measurements_and_exactness(run_all_cpu, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "experiments"))
    monkeypatch.syspath_prepend(str(ROOT / "experiments" / "gpu"))
    from runner import RUN_COLUMNS

    out, _ = run_all_cpu
    runs = pd.read_csv(out / "runs.csv")
    assert list(runs.columns) == list(RUN_COLUMNS)
    native = runs[runs.link == "native"]
    # most important first: in-core, every policy at the smallest budget, then the larger one
    assert list(native.policy) == ["in-core (plain)"] + ["pooch", "superneurons", "swap-all"] * 2
    assert list(native.budget_fraction.iloc[1:]) == [0.9] * 3 + [1.0] * 3
    assert (runs.status == "ok").all(), runs[["policy", "status", "error"]]
    planned = runs[runs.policy != "in-core (plain)"]
    assert (planned.params_identical == True).all() and (planned.losses_identical == True).all()  # noqa: E712
    assert (planned.predicted_s > 0).all() and (planned.measured_s > 0).all()
    assert (planned.measured_peak_bytes <= planned.budget_bytes).all()
    assert (planned.keep + planned.swap + planned.recompute > 0).all()
    swap_all = planned[planned.policy == "swap-all"]
    assert (swap_all.keep == 0).all() and (swap_all.swap > 0).all()
    emulated = runs[runs.link == "pcie3-emulated"]
    assert list(emulated.policy) == ["pooch"]
    assert emulated.fitted_d2h_gbps.iloc[0] == pytest.approx(12.0)
    links = pd.read_csv(out / "link.csv")
    assert links.exact.all()
    slow = links[links.link == "pcie3-emulated"]
    assert (slow.seconds >= slow.target_s).all()        # copies take at least the link's time
    profiles = pd.read_csv(out / "profiles.csv")
    assert list(profiles.link) == ["native", "pcie3-emulated"]
    assert (profiles.pool_limit_bytes > 15 * 2**30).all()
    targets = pd.read_csv(out / "targets.csv")
    assert {"pooch faster than superneurons (time ratio)",
            "feasible plans that ran out of memory",
            "parameters bit-identical to in-core"} <= set(targets.target)
    oom = targets[targets.target == "feasible plans that ran out of memory"]
    assert (oom.value == 0).all()



def test_a_deadline_leaves_skipped_rows_and_a_report(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "experiments"))
    monkeypatch.syspath_prepend(str(ROOT / "experiments" / "gpu"))
    import measure

    # 0.1 s left whenever asked: the profile starts (tiny reserves nothing), no run does
    monkeypatch.setattr(measure.Clock, "left", lambda self: 0.1)
    assert measure.main([str(tmp_path), "--cpu", "--tiny", "--emulate", "none"]) == 0
    runs = pd.read_csv(tmp_path / "runs.csv")
    assert (runs.status == "skipped").all() and len(runs) == 1 + 3 + 3
    assert (pd.read_csv(tmp_path / "profiles.csv").model == "small-resnet").all()
    (tmp_path / "targets.csv").unlink()
    assert measure.main([str(tmp_path), "--report-only"]) == 0
    assert (pd.read_csv(tmp_path / "targets.csv").passed == "no data").all()


def test_diagnose_memory_logs_the_executors_actions_with_the_profile_and_plan(tmp_path):
    """``diagnose_memory.py --log-dir`` (run_all.sh's attribution step on a GPU): on the CPU
    device its log holds the executor's actions in order, per iteration and op, beside the
    profile and the plan it ran, so a GPU log can be read against them offline."""
    out = subprocess.run([sys.executable, str(ROOT / "experiments/gpu/diagnose_memory.py"),
                          "small-resnet", "8", "16458048", "pooch", "--cpu", "--log-dir",
                          str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    log = pd.read_csv(tmp_path / "allocations_pooch.csv")
    assert list(log.columns) == ["iteration", "seq", "op", "kind", "bytes", "tensor", "key"]
    assert {"swap_out", "release", "swap_in"} <= set(log.kind)
    assert log.seq.is_monotonic_increasing and log.iteration.max() >= 3
    assert (tmp_path / "plan_pooch.csv").is_file() and (tmp_path / "profile_pooch").is_dir()
