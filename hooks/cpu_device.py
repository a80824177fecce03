"""The CPU device: a GPU in everything but speed, so the whole loop runs for real on a CPU.

* **Copy engines.** A device-to-host and a host-to-device engine, each one worker thread with
  an ordered queue (a CUDA stream): a copy starts when the ones queued before it on its engine
  are done, really moves the bytes, and takes at least the emulated link's time (``link``'s
  latency + bytes / bandwidth; the real copy time counts towards it). Each copy sets an event
  when it lands. NumPy's copy and BLAS release the GIL, so copies overlap compute.
* **The same protocol as the CuPy device.** ``swap_out`` queues the copy and returns at once;
  ``finish_swap_out`` waits for its event, and only then may the executor drop the device
  array (the transfer holds it until then); ``swap_in`` allocates the device array and queues
  the copy back (after the swap-out of the same map) and returns the array *before* its bytes
  are there; ``wait_swap_in`` is where compute waits. ``poison=True`` fills a swap-in's array
  with NaN until the copy lands, so reading it early shows.
* **Memory measured, not modelled.** With the counting allocator (hooks/cpu_memory.py) every
  byte of NumPy array data allocated while PoocH runs is counted when it is allocated and
  freed: feature maps, their gradients, im2col columns, any temporary. Used bytes are the
  resident bytes (parameters, gradients, optimizer state: ``note_resident``) plus the counted
  bytes that are not resident; the peak comes from the allocator, so a peak inside an op is
  seen too. The budget is enforced on that, naming the op. Without a C compiler the device
  falls back to counting the arrays the graph holds (``memory_source`` says which). Arrays
  made before the device began are never counted: a batch taken straight from a dataset
  loaded up front is measured as no device bytes, where the plan (like a GPU) holds it.
* **Host memory.** Swapped maps live in host buffers of exactly their size, reused by size
  (no power-of-two rounding) and never counted as device memory; ``host_bytes`` is what they
  hold now and ``host_peak`` the most at once.
"""
from __future__ import annotations

import queue
import threading
import time
import weakref
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Iterator

import numpy as np

from pooch_ext.errors import PoochError
from pooch_ext.hooks import cpu_memory
from pooch_ext.hooks.device import (DeviceOutOfMemoryError, Transfer, WallTimer, _layout,
                                    laid_out)
from pooch_ext.hooks.model_state import base_of, grad_of, model_arrays_with, resident_bytes
from pooch_ext.hooks.linkemu import copy_s, emulated_link, stretched_s
from pooch_ext.links import Link, get_link
from pooch_ext.units import format_bytes


class CopyEngine:
    """One copy direction: copies run one after another in the order queued, each taking at
    least ``seconds(nbytes)``; ``submit`` returns an event set when the copy has landed."""

    def __init__(self, name: str, seconds: Callable[[int], float], delay_s: float = 0.0) -> None:
        self.name = name
        self.seconds = seconds
        self.delay_s = delay_s            # tests: hold every copy back this long
        self.busy_s = 0.0                 # copy time so far (for overlap measurements)
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._work, name=f"pooch-{name}", daemon=True)
        self._thread.start()

    def submit(self, destination: np.ndarray, source: np.ndarray, nbytes: int,
               after: threading.Event | None = None) -> tuple[threading.Event, list, list]:
        """Queue ``destination[...] = source``; returns (landed event, [seconds once landed],
        the job, for ``forget``)."""
        done, took = threading.Event(), []
        job = [destination, source]
        self._queue.put((job, nbytes, after, done, took))
        return done, took, job

    @staticmethod
    def forget(job: list) -> None:
        """Nobody will read this copy's result: let go of its arrays now (a copy already
        under way keeps them until it ends). It still takes its time on the engine, as a
        queued GPU copy does, whose source memory the pool may hand out again meanwhile."""
        job[:] = [None, None]

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                self._queue.task_done()
                return
            job, nbytes, after, done, took = item
            del item
            if after is not None:
                after.wait()
            start = time.perf_counter()
            if self.delay_s:
                time.sleep(self.delay_s)
            destination, source = job
            self.forget(job)          # from here on only this copy holds them
            del job
            if source is not None:
                np.copyto(destination, source, casting="no")
            del destination, source
            remaining = self.seconds(nbytes) - (time.perf_counter() - start)
            if remaining > 0:
                time.sleep(remaining)
            elapsed = time.perf_counter() - start
            self.busy_s += elapsed
            took.append(elapsed)
            done.set()
            self._queue.task_done()

    def drain(self) -> None:
        """Wait until every queued copy has landed."""
        self._queue.join()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)


class HostBuffers:
    """Host buffers by exact size, reused; a buffer goes back with the event of the last copy
    that used it and is taken again only once that copy has landed."""

    def __init__(self) -> None:
        self._free: dict[int, list[tuple[np.ndarray, threading.Event | None]]] = defaultdict(list)
        self.allocated = 0       # bytes of all buffers made so far (held or free)

    def take(self, nbytes: int) -> np.ndarray:
        spare = self._free.get(nbytes)
        if spare:
            buffer, guard = spare.pop()
            if guard is not None:
                guard.wait()
            return buffer
        with uncounted():
            buffer = np.empty(max(nbytes, 1), np.uint8)[:nbytes]
        self.allocated += nbytes
        return buffer

    def give(self, buffer: np.ndarray, guard: threading.Event | None) -> None:
        self._free[buffer.nbytes].append((buffer, guard))


@contextmanager
def uncounted() -> Iterator[None]:
    """Arrays allocated inside are not device memory (host buffers)."""
    counter = cpu_memory.counter()
    was = counter.use(False) if counter is not None else False
    try:
        yield
    finally:
        if was:
            counter.use(True)


def layout_view(buffer: np.ndarray, like: np.ndarray) -> np.ndarray:
    """``buffer``'s bytes viewed with ``like``'s shape, dtype and axis order (a dense block in
    the order ``like``'s strides walk it), for a copy that moves the bytes as they lie."""
    return laid_out(buffer.view(like.dtype), like.shape, like.strides)


class CpuDevice:
    """NumPy arrays as device memory, measured; two copy engines; see the module docstring."""

    kind = "cpu"

    def __init__(self, budget: int | None = None, link: Link | str = "pcie3",
                 throttle: Link | str | None = None, measure: bool = True,
                 copy_delay_s: float = 0.0, poison: bool = False) -> None:
        self.native = get_link(link)
        self.throttle = None if throttle is None else get_link(throttle)
        # what profiles made here plan with: the native link, or the one it is throttled to
        self.link = self.native if throttle is None else emulated_link(self.native, throttle)
        self.name = "cpu"
        self.budget = None if budget is None else int(budget)
        self.enforce = True
        self.on_overrun: Callable[[str, int], None] | None = None
        self.poison = poison
        self.resident = 0
        self._resident_counted = 0
        self.counter = cpu_memory.counter() if measure else None
        self.memory_source = "allocator" if self.counter is not None else "tracked arrays"
        self._was_counting = False
        self.used = 0                          # tracked-arrays accounting (no counter)
        self._tracked_peak = 0
        self._reported_peak = 0     # an overrun's peak, kept in ``peak`` past its report
        self._live: dict[int, int] = {}
        self.host = HostBuffers()
        self.host_bytes = 0
        self.host_peak = 0
        self.listener: Callable[[str, int, int, int], None] | None = None
        self.copy_delay_s = copy_delay_s
        self._engines: tuple[CopyEngine, CopyEngine] | None = None
        self._counting = False
        self.start()

    def start(self) -> None:
        """Count allocations from now on (the copy engines start with the first copy)."""
        if self.counter is not None and not self._counting:
            self._was_counting = self.counter.use(True)
            self.counter.begin()
            self._counting = True

    @property
    def d2h(self) -> CopyEngine:
        return self._copy_engines()[0]

    @property
    def h2d(self) -> CopyEngine:
        return self._copy_engines()[1]

    def _copy_engines(self) -> tuple[CopyEngine, CopyEngine]:
        if self._engines is None:
            self._engines = (CopyEngine("d2h", lambda n: self._copy_s("d2h", n), self.copy_delay_s),
                             CopyEngine("h2d", lambda n: self._copy_s("h2d", n), self.copy_delay_s))
        return self._engines

    # ------------------------------------------------------------ setup
    @property
    def xp(self) -> Any:
        """The array module of this device's arrays (NumPy)."""
        return np

    def capacity_bytes(self) -> int:
        from pooch_ext.units import UNLIMITED
        return UNLIMITED if self.budget is None else self.budget

    def set_budget(self, budget: int | None) -> None:
        self.budget = None if budget is None else int(budget)

    def restore(self) -> None:
        """Wait for every copy, stop the engines, stop counting allocations, forget the overrun
        listener (the device can be used again: engines and counting start when needed)."""
        self.on_overrun = None
        if self._engines is not None:
            for engine in self._engines:
                engine.drain()
                engine.close()
            self._engines = None
        if self._counting:
            self._counting = False
            if not self._was_counting:
                self.counter.use(False)

    # ------------------------------------------------------------ accounting
    def host_side(self) -> Any:
        """A block whose arrays are the host's, not the device's (PoocH's own planning data,
        snapshots): the allocator does not count them."""
        return uncounted()

    def apart(self) -> Any:
        """Work that is not training's (split measurements on probes, the profiler's reruns
        of an op) outside the peak and the count: the allocator counter's ``apart``, where
        memory is counted by it."""
        return self.counter.apart() if self.counter is not None else nullcontext()

    def note_resident(self, model: Any) -> None:
        """Parameters, gradients (present or to come) and optimizer state: counted by formula,
        so what the allocator counts of them is taken out of its count. Gradients are taken
        out whole, present or not: Chainer makes a parameter's gradient during backward and
        holds it in its gradient table until backward ends, where no model array points to it
        yet, so the allocator's count is taken to hold every gradient. Where a loop clears the
        gradients before forward (``optimizer.update(lossfun)``, the first iteration), forward
        is measured short by the gradients' bytes, never over; gradients are then counted the
        same in every iteration, the first (which PoocH checks the budget on) included."""
        with uncounted():      # a state probe's arrays (model_state.optimizer_state_bytes)
            self.resident = resident_bytes(model)
        if self.counter is not None:
            for param in model.params():
                grad = grad_of(param)
                if isinstance(grad, np.ndarray) and grad.base is None and \
                        self.counter.counted_bytes(grad) == 0 and grad.nbytes and \
                        grad.dtype == param.array.dtype:
                    # made before counting began (Chainer fills a new parameter's with NaN):
                    # a copy counts, as every later iteration's will (taken out whole below,
                    # an uncounted one had left the first iteration short by its bytes). One
                    # of another dtype (the array cast by hand) is left: Chainer refuses it
                    # back, and the loop's cleargrads drops it
                    param.grad = grad.copy()
            grads = {id(base_of(g)) for g in map(grad_of, model.params()) if g is not None}
            bases = {id(base_of(a)): base_of(a) for a in model_arrays_with(model)}
            self._resident_counted = sum(self.counter.counted_bytes(a) for key, a in bases.items()
                                         if key not in grads)
            self._resident_counted += sum(int(p.array.nbytes) for p in model.params()
                                          if p.array is not None)

    def track(self, array: Any, tensor: int = -1) -> None:
        """Without the allocator: count ``array``'s buffer until Python frees it."""
        if array is None or self.counter is not None:
            return
        base = base_of(array)
        key = id(base)
        if key in self._live:
            return
        nbytes = int(base.nbytes)
        self._live[key] = nbytes
        self.used += nbytes
        self._tracked_peak = max(self._tracked_peak, self.used)
        weakref.finalize(base, self._freed, key, nbytes, tensor)
        if self.listener is not None:
            self.listener("malloc", nbytes, tensor, key)

    def _freed(self, key: int, nbytes: int, tensor: int) -> None:
        if self._live.pop(key, None) is not None:
            self.used -= nbytes
            if self.listener is not None:
                self.listener("free", nbytes, tensor, key)

    def _activations(self, peak: bool) -> int:
        if self.counter is None:
            return self._tracked_peak if peak else self.used
        return self.held(self.counter.peak() if peak else self.counter.live()) - self.resident

    def held(self, counted: int) -> int:
        """Device bytes when the allocator counts ``counted`` bytes: the resident bytes by
        formula plus the counted bytes that are not the model's."""
        return self.resident + max(0, counted - self._resident_counted)

    def used_bytes(self) -> int:
        return self.resident + self._activations(peak=False)

    @property
    def peak(self) -> int:
        """Most bytes held at once since ``reset_peak`` (inside ops too, with the allocator)."""
        return max(self.resident + self._activations(peak=True), self._reported_peak)

    def reset_peak(self) -> None:
        self._restart_peak()
        self._reported_peak = 0

    def _restart_peak(self) -> None:
        if self.counter is not None:
            self.counter.reset_peak()
        self._tracked_peak = self.used

    def check(self, where: str = "", index: int | None = None, function: Any = None) -> None:
        """Over the budget (when enforced) since the last reset: DeviceOutOfMemoryError naming
        ``where`` (the op that just ran or is about to), or, when ``on_overrun`` is set, that
        message handed to it and the step goes on (PoocH sets it once parameters were updated:
        stopping then would lose the promise, and this device's memory is emulated)."""
        total = self.resident + self._activations(peak=True)
        if self.enforce and self.budget is not None and total > self.budget:
            if index is not None:
                where = f"{where} {index}" + (f" ({type(function).__name__})" if function else "")
            # recorded while training goes on, it is no error; its bytes show a small excess
            what = "out of memory" if self.on_overrun is None else "over its budget"
            message = (f"CPU device {what}{' at ' + where if where else ''}: "
                       f"{format_bytes(total)} held ({total} bytes, {self.memory_source}) > "
                       f"budget {format_bytes(self.budget)} ({self.budget} bytes)")
            if self.on_overrun is None:
                raise DeviceOutOfMemoryError(message)
            self.on_overrun(message, total)
            # one report per overrun, not one per op after it; ``peak`` still shows it
            self._reported_peak = max(self._reported_peak, total)
            self._restart_peak()

    # ------------------------------------------------------------ copies
    def swap_out(self, array: Any, timed: bool = False) -> Transfer:
        nbytes = int(array.nbytes)
        buffer = self.host.take(nbytes)
        self.host_bytes += nbytes
        self.host_peak = max(self.host_peak, self.host_bytes)
        host = layout_view(buffer, array)
        transfer = Transfer(nbytes, tuple(array.shape), array.dtype, _layout(array), host,
                            source=array, strides=tuple(array.strides))
        transfer.events["buffer"] = buffer
        done, took, job = self.d2h.submit(host, array, nbytes)
        transfer.events["out_done"], transfer.events["out_took"] = done, took
        transfer.events["out_job"] = job
        return transfer

    def finish_swap_out(self, transfer: Transfer) -> None:
        """Wait until the copy is on the host; only then may the device array go."""
        transfer.events["out_done"].wait()
        transfer.source = None

    def swap_in(self, transfer: Transfer, timed: bool = False) -> Any:
        if transfer.host is None:
            raise PoochError("swap-in of a map whose host copy was discarded")
        array = np.empty_like(transfer.host, order="K")
        if self.poison and array.dtype.kind == "f":
            array.fill(np.nan)
        done, took, _ = self.h2d.submit(array, transfer.host, transfer.nbytes,
                                        after=transfer.events["out_done"])
        transfer.events["in_done"], transfer.events["in_took"] = done, took
        return array

    def landed(self, transfer: Transfer, direction: str) -> bool:
        """Whether the copy ``direction`` ("out" or "in") of ``transfer`` is done (no wait)."""
        event = transfer.events.get(f"{direction}_done")
        return event is None or event.is_set()

    def wait_swap_in(self, transfer: Transfer) -> None:
        """Compute waits here for the copy back to land."""
        transfer.events["in_done"].wait()

    def discard(self, transfer: Transfer) -> None:
        transfer.source = None
        if "out_job" in transfer.events:
            self.d2h.forget(transfer.events.pop("out_job"))
        if transfer.host is not None:
            events = transfer.events
            guard = events.get("in_done", events.get("out_done"))
            self.host.give(events.pop("buffer"), guard)
            self.host_bytes -= transfer.nbytes
            transfer.host = None

    def transfer_seconds(self, transfer: Transfer) -> tuple[float | None, float | None]:
        """Measured copy times of the copies that landed (call after ``synchronize``)."""
        out = transfer.events.get("out_took") or [None]
        back = transfer.events.get("in_took") or [None]
        return out[0], back[0]

    def _copy_s(self, direction: str, nbytes: int) -> float:
        """The emulated link's time for a copy (stretched to the throttle's, when set)."""
        native = copy_s(self.native, direction, nbytes)
        if self.throttle is None:
            return native
        return stretched_s(native, copy_s(self.throttle, direction, nbytes))

    # ------------------------------------------------------------ timing
    def timer(self) -> WallTimer:
        return WallTimer()

    def synchronize(self) -> None:
        """Wait for both copy engines to finish what is queued."""
        for engine in self._engines or ():
            engine.drain()
