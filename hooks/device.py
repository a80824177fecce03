"""Devices the executor drives: a real CuPy GPU, and the CPU device for machines without.

Both offer the same small interface, so hooks/executor.py has one code path:

* ``swap_out(array) -> Transfer`` starts a device -> host copy after the work already queued on
  the compute stream; ``finish_swap_out(t)`` blocks until that copy is done (only then may the
  device copy be dropped); ``swap_in(t) -> array`` allocates a device array and starts the
  host -> device copy; ``wait_swap_in(t)`` makes compute wait for it; ``discard(t)`` gives the
  host buffer back.
* ``note_resident(model)`` / ``track(array)`` / ``check(where)`` / ``used_bytes()`` / ``peak``
  (since ``reset_peak()``): memory accounting. The CuPy pool accounts for itself
  (``MemoryPool.set_limit`` enforces the budget); the CPU device (hooks/cpu_device.py)
  measures NumPy's allocations and raises ``DeviceOutOfMemoryError`` over its budget.
* ``timer()`` times compute (CUDA events on the GPU, the wall clock on the CPU).

A swapped map comes back with the very strides it left with: a convolution's output is a
transposed view (Chainer's im2col path ends in ``rollaxis``) that fills one dense block, so
its bytes are copied as they lie and the view is rebuilt around the new block. No relayout
copy is made (it would cost memory and time the plan does not know about), and every later
kernel sees the layout it would have seen in plain Chainer (a C-contiguous copy changes the
rounding of later reductions). On the GPU only maps that are not one dense block (strided
slices) are made contiguous first (``CupyDevice.relayouts`` counts them).

Link emulation (hooks/linkemu.py): ``CupyDevice(throttle="pcie3")`` stretches every copy to
the preset's time on the GPU's copy streams; the CPU device's copy engines take at least their
link's time (``CpuDevice(link=..., throttle=...)``: the longer of the two links' times).
"""
from __future__ import annotations

import contextlib
import ctypes
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

import pooch_ext  # noqa: F401  (chainer import compat)

from pooch_ext.errors import DeviceOutOfMemoryError, PoochError  # noqa: F401  (importable here)
from pooch_ext.hooks.arena import arena_for
from pooch_ext.hooks.pool_peak import pool_headroom, pool_peak_hook, release_pool
from pooch_ext.hooks.model_state import resident_bytes
from pooch_ext.hooks.linkemu import CopyThrottle
from pooch_ext.links import Link, get_link


@dataclass
class Transfer:
    """One feature map's trip to the host and back: the host copy and the copy timings."""

    nbytes: int
    shape: tuple[int, ...]
    dtype: np.dtype
    order: str                      # "C" or "F": the layout to restore
    host: Any = None                # host-side copy (pinned buffer on the GPU)
    source: Any = None              # device array kept alive until the swap-out is done
    out_s: float | None = None      # seconds of the copy (as measured)
    in_s: float | None = None
    events: dict = field(default_factory=dict)
    strides: tuple[int, ...] | None = None   # GPU: the exact strides to restore (dense views)


def _layout(array: Any) -> str:
    flags = array.flags
    return "F" if flags.f_contiguous and not flags.c_contiguous else "C"


def laid_out(flat: Any, shape: tuple[int, ...], strides: tuple[int, ...] | None) -> Any:
    """``flat`` (the elements in the order they lie in memory) viewed as an array of
    ``shape`` whose axes lie in memory in the order ``strides`` gives, largest first (C
    order without them): how a dense copy keeps its original's layout."""
    if strides is None or len(strides) != len(shape):
        return flat.reshape(shape)
    order = sorted(range(len(shape)), key=lambda a: -abs(strides[a]))
    inverse = [order.index(a) for a in range(len(order))]
    return flat.reshape([shape[a] for a in order]).transpose(inverse)


def broadcast_core(array: Any) -> tuple[Any, tuple[int, ...] | None]:
    """A broadcast view (zero strides, F.broadcast_to's output) as the part that holds its
    distinct elements, each zero-stride axis cut to length 1, and the shape to broadcast
    that back to; (array, None) for any other array. A dense copy of the whole view would
    lay its elements out in an order of its own (the zero strides tie), and a later
    reduction over what is computed from it would add in another order: not the same bits.
    The core is swapped instead (its bytes, not the view's) and broadcast back on return."""
    zero = tuple(s == 0 and n > 1 for n, s in zip(array.shape, array.strides))
    if not any(zero):
        return array, None
    return array[tuple(slice(0, 1) if z else slice(None) for z in zero)], tuple(array.shape)


def buffer_bytes(array: Any) -> int:
    """The bytes an array keeps alive: its own, or those of the smaller array it views (a
    broadcast view, which F.sum's backward hands out as a gradient: 16 KB of a 480 KB one)."""
    owner = array
    while getattr(owner, "base", None) is not None and hasattr(owner.base, "nbytes"):
        owner = owner.base
    return min(int(array.nbytes), int(owner.nbytes))


def dense_layout(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> bool:
    """True when the elements fill exactly one block of ``size * itemsize`` bytes that starts at
    the first element, in any axis order (C, F, or a transposed view of either)."""
    if 0 in shape:
        return True
    expected = itemsize
    for stride, n in sorted((s, n) for n, s in zip(shape, strides) if n > 1):
        if stride != expected:
            return False
        expected *= n
    return True


class WallTimer:
    """Times host work with the wall clock (``HostSimDevice.timer``)."""

    __slots__ = ("start_t", "end_t")

    def __init__(self) -> None:
        self.start_t = self.end_t = 0.0

    def start(self) -> None:
        self.start_t = time.perf_counter()

    def stop(self) -> None:
        self.end_t = time.perf_counter()

    def seconds(self) -> float:
        return self.end_t - self.start_t


# ---------------------------------------------------------------------------------- CuPy

class EventTimer:
    """Times GPU work with two CUDA events on the current stream (``CupyDevice.timer``)."""

    __slots__ = ("cupy", "begin", "end")

    def __init__(self, cupy) -> None:
        self.cupy = cupy
        self.begin = cupy.cuda.Event()
        self.end = cupy.cuda.Event()

    def start(self) -> None:
        self.begin.record(self.cupy.cuda.get_current_stream())

    def stop(self) -> None:
        self.end.record(self.cupy.cuda.get_current_stream())

    def seconds(self) -> float:
        """Elapsed GPU time; call after ``CupyDevice.synchronize``."""
        return self.cupy.cuda.get_elapsed_time(self.begin, self.end) / 1e3


class PinnedBuffers:
    """Page-locked host buffers, reused across iterations by exact size.

    A buffer handed back comes with the event of the last copy that used it; it is taken again
    only once that event has completed, so a copy in flight never sees its memory reused.
    """

    def __init__(self, cupy) -> None:
        self.cupy = cupy
        self._free: dict[int, list[tuple[Any, np.ndarray, Any]]] = defaultdict(list)
        self.allocated_bytes = 0

    def take(self, nbytes: int) -> tuple[Any, np.ndarray]:
        spare = self._free.get(nbytes)
        if spare:
            memory, view, guard = spare.pop()
            if guard is not None:
                guard.synchronize()
            return memory, view
        memory = self.cupy.cuda.alloc_pinned_memory(max(nbytes, 1))
        view = np.frombuffer(memory, np.uint8, nbytes)
        self.allocated_bytes += nbytes
        return memory, view

    def give(self, buffer: tuple[Any, np.ndarray], guard: Any) -> None:
        self._free[buffer[1].nbytes].append((buffer[0], buffer[1], guard))

    def clear(self) -> None:
        for spare in self._free.values():
            for _, _, guard in spare:
                if guard is not None:
                    guard.synchronize()
        self._free.clear()
        self.allocated_bytes = 0


class CupyDevice:
    """The current CUDA device through CuPy.

    Compute stays on the caller's current stream; swap-outs run on their own non-blocking D2H
    stream and swap-ins on an H2D stream, ordered against compute with CUDA events, through
    reusable pinned host buffers. The budget is ``MemoryPool.set_limit`` on the default pool.
    ``throttle`` (a link preset) stretches every copy to that link's speed (hooks/linkemu.py);
    the copy streams then get the highest priority, so the one-thread timing kernels on them
    are scheduled ahead of compute blocks and do not delay the copies.
    """

    kind = "cuda"

    def __init__(self, link: Link | str | None = None,
                 throttle: Link | str | None = None, arena: bool | None = None) -> None:
        import cupy

        self.cupy = cupy
        self.pool = cupy.get_default_memory_pool()
        self.device_id = cupy.cuda.Device().id
        props = cupy.cuda.runtime.getDeviceProperties(self.device_id)
        name = props["name"]
        self.name = name.decode() if isinstance(name, bytes) else str(name)
        self.link = None if link is None else get_link(link)
        self.throttle = None if throttle is None else CopyThrottle(throttle, cupy)
        # CUDA clamps a priority beyond the device's range to its highest one
        priority = None if throttle is None else -1000
        self.d2h = cupy.cuda.Stream(non_blocking=True, priority=priority)
        self.h2d = cupy.cuda.Stream(non_blocking=True, priority=priority)
        self.pinned = PinnedBuffers(cupy)
        self.relayouts = 0              # swapped maps that were not one dense block
        self.budget: int | None = None
        self._old_limit: int | None = None
        self.resident = 0
        self._boundary_peak = 0
        # the pool's peak inside ops too (im2col columns, temporaries): entered at the first
        # reset_peak, left at restore; op boundaries alone saw 16.4 MiB of a 46.8 MiB plan
        self._pool_peak = pool_peak_hook(cupy)
        self._hooked = False
        self.listener = None
        self.arena = arena_for(cupy, arena, profiling=lambda: self.listener is not None)
        self.pool_headroom = pool_headroom()       # (a diagnostic; 1 unless set)

    @property
    def xp(self) -> Any:
        """The array module of this device's arrays (CuPy)."""
        return self.cupy

    def capacity_bytes(self) -> int:
        """What this process can hold: free device memory plus what the pool already has."""
        free, _total = self.cupy.cuda.runtime.memGetInfo()
        return int(free + self.pool.total_bytes())

    def set_budget(self, budget: int | None) -> None:
        """The pool's limit, set on a pool rid of earlier work (``release_pool``)."""
        release_pool(self.cupy)
        if self._old_limit is None:
            self._old_limit = int(self.pool.get_limit())
        self.budget = None if budget is None else int(budget)
        self.pool.set_limit(size=0 if budget is None else int(budget * self.pool_headroom))
        if self.arena is not None:
            self.arena.install()

    def restore(self) -> None:
        """Give the pool its previous limit back, leave the peak hook, wait for every copy."""
        self.synchronize()
        if self._hooked:
            self._pool_peak.__exit__(None, None, None)
            self._hooked = False
        if self.arena is not None:
            self.arena.uninstall()
        if self._old_limit is not None:
            self.pool.set_limit(size=self._old_limit)
            self._old_limit = None

    # ------------------------------------------------------------ accounting
    def host_side(self) -> Any:
        """A block whose arrays are the host's (NumPy arrays never touch the CuPy pool), or
        whose device arrays are not the training's (plain Chainer beside PoocH): ``apart``,
        as the CPU device leaves them uncounted."""
        return self.apart()

    def note_resident(self, model: Any) -> None:
        """Resident bytes, for reports (the pool counts them with everything else)."""
        self.resident = resident_bytes(model)

    def track(self, array: Any, tensor: int = -1) -> None:
        """The pool accounts for every allocation itself."""

    def used_bytes(self) -> int:
        return int(self.pool.used_bytes())

    @property
    def peak(self) -> int:
        """The pool's highest used bytes since ``reset_peak()``: after any allocation once
        the hook is entered, else at the op boundaries ``check`` saw."""
        return max(self._boundary_peak, self._pool_peak.peak if self._hooked else 0)

    def reset_peak(self) -> None:
        if not self._hooked:
            self._pool_peak.__enter__()
            self._hooked = True
        if self.arena is not None:
            self.arena.new_iteration()
        self._pool_peak.reset()
        self._boundary_peak = self.used_bytes()

    @contextlib.contextmanager
    def apart(self) -> Any:
        """Work that is not training's (split measurements on probes, which run the whole op
        too; the profiler's reruns of an op; plain Chainer beside PoocH) outside the budget,
        the peak and the arena, as the CPU device counts it apart (under the limit,
        small-resnet b256's ran out). Where it left the pool holding more than the limit, the
        free blocks go back to the driver: a cached block past the limit would serve later
        requests the limit never checks."""
        limit = int(self.pool.get_limit())
        peaks = (self._pool_peak.peak, self._pool_peak.total_peak, self._boundary_peak)
        self.pool.set_limit(size=0)
        try:
            with self.arena.aside() if self.arena is not None else contextlib.nullcontext():
                yield
        finally:
            if limit and int(self.pool.total_bytes()) > limit:
                self.pool.free_all_blocks()
            self.pool.set_limit(size=limit)
            self._pool_peak.peak, self._pool_peak.total_peak, self._boundary_peak = peaks

    def check(self, where: str = "", index: int | None = None, function: Any = None) -> None:
        """Record the peak (the pool itself raises OutOfMemoryError over its limit)."""
        self._boundary_peak = max(self._boundary_peak, int(self.pool.used_bytes()))

    # ------------------------------------------------------------ copies
    def _event(self, stream, timing: bool = False):
        event = self.cupy.cuda.Event(disable_timing=not timing)
        event.record(stream)
        return event

    def _copy(self, stream: Any, direction: str, nbytes: int, start: Callable[[], None]) -> None:
        """Queue one copy on ``stream`` (stretched to the throttle's link when one is set)."""
        if not nbytes:
            return
        if self.throttle is None:
            start()
            return
        with self.throttle.around(stream, direction, nbytes):
            start()

    def swap_out(self, array: Any, timed: bool = False) -> Transfer:
        cupy = self.cupy
        if not dense_layout(array.shape, array.strides, array.itemsize):
            array = cupy.ascontiguousarray(array)   # rare: copy, restored C-contiguous
            self.relayouts += 1
        order = _layout(array)
        compute = cupy.cuda.get_current_stream()
        self.d2h.wait_event(self._event(compute))            # after the producer / last reader
        nbytes = int(array.nbytes)
        buffer = self.pinned.take(nbytes)
        transfer = Transfer(nbytes, tuple(array.shape), array.dtype, order, buffer,
                            strides=tuple(array.strides), source=array)
        if timed:
            transfer.events["out_start"] = self._event(self.d2h, True)
        self._copy(self.d2h, "d2h", nbytes, lambda: array.data.copy_to_host_async(
            ctypes.c_void_p(buffer[1].ctypes.data), nbytes, self.d2h))
        transfer.events["out_done"] = self._event(self.d2h, timed)
        return transfer

    def finish_swap_out(self, transfer: Transfer) -> None:
        """Block until the copy is on the host; only then may the device memory be reused."""
        transfer.events["out_done"].synchronize()
        transfer.source = None

    def swap_in(self, transfer: Transfer, timed: bool = False) -> Any:
        cupy = self.cupy
        if transfer.host is None:
            raise PoochError("swap-in of a map whose host copy was discarded")
        if transfer.nbytes and transfer.strides is not None:
            # the same dense block, viewed with the strides it left with
            array = cupy.ndarray(transfer.shape, transfer.dtype,
                                 memptr=cupy.cuda.alloc(transfer.nbytes), strides=transfer.strides)
        else:
            array = cupy.empty(transfer.shape, transfer.dtype, order=transfer.order)
        compute = cupy.cuda.get_current_stream()
        # the block may have been freed by compute work still queued: copy after that work
        self.h2d.wait_event(self._event(compute))
        self.h2d.wait_event(transfer.events["out_done"])
        if timed:
            transfer.events["in_start"] = self._event(self.h2d, True)
        self._copy(self.h2d, "h2d", transfer.nbytes, lambda: array.data.copy_from_host_async(
            ctypes.c_void_p(transfer.host[1].ctypes.data), transfer.nbytes, self.h2d))
        transfer.events["in_done"] = self._event(self.h2d, timed)
        return array

    def landed(self, transfer: Transfer, direction: str) -> bool:
        """Whether the copy ``direction`` ("out" or "in") of ``transfer`` is done (no wait)."""
        event = transfer.events.get(f"{direction}_done")
        return event is None or bool(event.done)

    def wait_swap_in(self, transfer: Transfer) -> None:
        self.cupy.cuda.get_current_stream().wait_event(transfer.events["in_done"])

    def discard(self, transfer: Transfer) -> None:
        # the device array may go now: a copy still reading it only fills a host buffer that
        # is given back guarded by that copy's event, and nothing reads that copy
        transfer.source = None
        if transfer.host is not None:
            guard = transfer.events.get("in_done", transfer.events.get("out_done"))
            self.pinned.give(transfer.host, guard)
            transfer.host = None

    def transfer_seconds(self, transfer: Transfer) -> tuple[float | None, float | None]:
        """Measured copy times (call after ``synchronize``); None where not timed."""
        elapsed = self.cupy.cuda.get_elapsed_time
        ev = transfer.events
        out_s = elapsed(ev["out_start"], ev["out_done"]) / 1e3 if "out_start" in ev else None
        in_s = elapsed(ev["in_start"], ev["in_done"]) / 1e3 if "in_start" in ev else None
        return out_s, in_s

    # ------------------------------------------------------------ timing
    def timer(self) -> EventTimer:
        return EventTimer(self.cupy)

    def synchronize(self) -> None:
        self.cupy.cuda.get_current_stream().synchronize()
        self.d2h.synchronize()
        self.h2d.synchronize()


def round_trip(device: Any, array: Any) -> tuple[float | None, float | None, Any]:
    """One timed swap-out and swap-in of ``array`` through ``device``'s own copy path:
    (D2H seconds, H2D seconds, the array that came back). Link calibration measures with it."""
    transfer = device.swap_out(array, timed=True)
    device.finish_swap_out(transfer)
    back = device.swap_in(transfer, timed=True)
    device.wait_swap_in(transfer)
    device.synchronize()
    out_s, in_s = device.transfer_seconds(transfer)
    device.discard(transfer)
    return out_s, in_s, back


def array_is_on_gpu(array: Any) -> bool:
    """A CuPy array (told by its type's module, so CuPy need not be importable)."""
    return type(array).__module__.split(".")[0] == "cupy"


def device_for(model: Any, budget: int | None = None,
               link: Link | str | None = None) -> Any:
    """The device a model lives on: CupyDevice on a GPU (``model.to_gpu()``), else the CPU
    device (hooks/cpu_device.py)."""
    from pooch_ext.hooks.cpu_device import CpuDevice

    xp = getattr(getattr(model, "device", None), "xp", np)
    on_gpu = getattr(xp, "__name__", "") == "cupy" or any(
        array_is_on_gpu(p.array) for p in model.params() if p.array is not None)
    if on_gpu:
        device = CupyDevice(link)
        device.budget = None if budget is None else int(budget)
        return device
    return CpuDevice(budget, "pcie3" if link is None else link)


def __getattr__(name: str) -> Any:
    """``HostSimDevice`` (the CPU device's former name) and ``CpuDevice`` from here too."""
    if name in ("CpuDevice", "HostSimDevice"):
        from pooch_ext.hooks.cpu_device import CpuDevice
        return CpuDevice
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
