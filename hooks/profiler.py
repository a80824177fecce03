"""Profiler: measure real training iterations, attached to the executor only while profiling.

The profiler is a set of stopwatches the executor (hooks/executor.py) calls at every op window
while it is attached (``attach()``; PoocH attaches it for the iterations it profiles and
detaches it once a graph has its plan, so a planned iteration runs the executor alone). It
times every forward and backward op (CUDA events on the GPU, the wall clock on the host),
records the device's malloc/free events per op (hooks/allocator.py) and the bytes each
function keeps for its backward (BatchNormalization statistics, Dropout mask, pooling argmax),
and has the executor time every swap-out and swap-in by the real copies. As in the paper (4.2)
the profiled iterations run with every feature map swapped, so a network that does not fit the
device can still be profiled; the plan that does so is whatever the executor was given (PoocH
passes the swap-all schedule).

Each measured iteration becomes an ``IterationSample``; hooks/measured_profile.py turns samples
into the measured Profile.
"""
from __future__ import annotations

import gc
import time
from typing import Any

import numpy as np
import pandas as pd

from pooch_ext.functions import RECOMPUTABLE
from pooch_ext.hooks import codecs
from pooch_ext.hooks.allocator import AllocationLog, cupy_memory_hook, scratch_bytes
from pooch_ext.hooks.conv_configs import conv_call, with_gradient
from pooch_ext.hooks.device import buffer_bytes
from pooch_ext.hooks.executor import Executor
from pooch_ext.hooks.function_nodes import TAG, node_state
from pooch_ext.hooks.measured_profile import IterationSample
from pooch_ext.hooks.model_state import base_of, model_arrays
from pooch_ext.hooks.recompute import RecomputeError, recompute
from pooch_ext.trace import GraphTrace

KEEP_SAMPLES = 16       # the most recent measured iterations a profiler holds
CODEC_TIMINGS = 2       # ReLU outputs an iteration on which the codecs are timed


def __getattr__(name: str) -> Any:
    """What moved to hooks/measured_profile.py stays reachable here for one release."""
    from pooch_ext._moved import moved_name
    return moved_name(__name__, name)


class Profiler:
    """Stopwatches on ``executor``'s iterations while attached; every measured iteration's
    IterationSample goes into ``samples``."""

    def __init__(self, executor: Executor, encodings: tuple[str, ...] = ()) -> None:
        self.executor = executor
        self.encodings = encodings    # the codecs the plan may use: what to measure for them
        self.samples: list[IterationSample] = []   # the most recent measured iterations
        self.last_sample: IterationSample | None = None   # of the iteration that just ended
        self.log = AllocationLog()
        self._cupy_hook: Any = None
        # the most a forward-only pass the first iteration dropped held above what the device
        # held as that iteration began: every later one runs it again, with the last
        # iteration's leftovers (``Refusals._check_first_tail``); 0 without one
        self.head_rise = 0
        self._start_held = 0
        self._model_ids: set[int] = set()
        self._new_iteration()

    def _new_iteration(self) -> None:
        self._fwd_timers: dict[int, Any] = {}
        self._bwd_timers: dict[int, tuple[int, Any]] = {}
        self._saved: dict[int, int] = {}
        self._grad_bytes: dict[int, tuple[int, ...]] = {}   # IterationSample.gradient_bytes
        self._dropped_peak = 0    # what leading forward-only passes held (``compacted``)
        self._conv_calls: dict[int, Any] = {}
        self._rerun_timers: dict[int, Any] = {}
        self._timing: tuple[int, Any] | None = None   # (op window, timer) running now
        # the profiler's own host seconds since the last op window ended (bookkeeping, rerun
        # timings: work the executor does not do), and per window what preceded its start
        self._own_s = 0.0
        self._own_before: dict[int, float] = {}
        self._scratch: dict[int, int] = {}    # op window -> measured scratch bytes
        self._entry: dict[int, int] = {}      # op window -> device bytes held as it starts
        self._gaps: dict[int, int] = {}       # op window -> device peak just before it
        self._inside: dict[int, int] = {}     # op window -> device peak inside it
        self._window_live = 0
        self._nonzero: dict[int, float] = {}
        self._codec_s: dict[str, list[tuple[float, float]]] = {}
        self._codecs_timed = 0
        self._end: tuple[int, int, bool] | None = None   # IterationSample.end
        # after the first pass: the most bytes a later pass could have held at once with
        # every map that was off the device (on demand) on it, as a plan may hold them, and
        # the bytes off it as the stretch since the last revisited op began. An upper bound on
        # the loops tried, kept for safety: counting only the maps a later pass reads asked
        # Chainer's DCGAN example 6.01 MiB instead of 7.26 MiB (later iterations need 5.57 MB)
        # but accepted a user's small GAN 1.4% below what its later iterations hold
        self._tail_upper = 0
        self._tail_host = 0
        # parameters holding a gradient as the first pass ended; those of them a later pass
        # of this iteration found cleared (IterationSample.stale_gradients)
        self._grads_after_first: set[int] | None = None
        self._stale: set[int] | None = None

    # ------------------------------------------------------------ switching
    @property
    def measuring(self) -> bool:
        return self.executor.profiler is self

    def attach(self) -> None:
        """Measure from the op starting now (at an iteration's start: all of it)."""
        executor = self.executor
        if executor.profiler is self:
            return
        if executor.profiler is not None:
            raise RuntimeError("the executor already has a profiler attached")
        executor.profiler = self
        self.log.enabled = True
        self._new_iteration()
        if executor.model is not None:
            self._model_ids = model_arrays(executor.model)
        if executor.device.kind == "cuda":         # (the CuPy device's arena pauses too)
            self._cupy_hook = cupy_memory_hook(self.log)
            self._cupy_hook.__enter__()
        executor.device.listener = self.log.record

    def detach(self) -> None:
        """Stop measuring: the executor runs on with nothing timed or logged."""
        executor = self.executor
        if executor.profiler is not self:
            return
        executor.profiler = None
        self.last_sample = None
        self.log.enabled = False
        self.log.clear()
        if self._cupy_hook is not None:
            self._cupy_hook.__exit__(None, None, None)
            self._cupy_hook = None
        executor.device.listener = None

    # ------------------------------------------------------------ op windows
    def _start(self, window: int) -> Any:
        began = time.perf_counter()
        device = self.executor.device
        timer = device.timer()
        self.log.op = window
        self._timing = (window, timer)
        counter = getattr(device, "counter", None)
        if counter is not None:
            # since the op before ended: this boundary
            self._gaps[window] = max(self._gaps.get(window, 0), device.held(counter.window()))
            self._window_live = counter.live()
            self._entry[window] = max(self._entry.get(window, 0),
                                      device.held(self._window_live))
            counter.reset_window()
        self._own_before[window] = self._own_s + (time.perf_counter() - began)
        self._own_s = 0.0
        timer.start()
        return timer

    def _stop(self) -> None:
        if self._timing is not None:
            self._timing[1].stop()
            began = time.perf_counter()
            device = self.executor.device
            counter = getattr(device, "counter", None)
            if counter is not None:   # what the op allocated and freed again inside itself
                inside = counter.window()
                scratch = inside - max(self._window_live, counter.live())
                window = self._timing[0]
                self._scratch[window] = max(self._scratch.get(window, 0), scratch)
                self._inside[window] = max(self._inside.get(window, 0), device.held(inside))
                counter.reset_window()
            self._timing = None
            self.log.op = -1
            self._own_s += time.perf_counter() - began

    # ------------------------------------------------------------ what the executor calls
    def iteration_started(self) -> None:
        self._new_iteration()
        executor = self.executor
        counter = getattr(executor.device, "counter", None)
        if executor.iteration == 0 and not executor.head_peak and counter is not None:
            counter.reset_window()   # what the loop made with NumPy alone before (Executor)
        self.last_sample = None
        self._start_held = int(executor.device.used_bytes())
        model = self.executor.model
        self._model_ids = model_arrays(model) if model is not None else set()

    def forward_began(self, index: int) -> None:
        self._fwd_timers[index] = self._start(index)

    def forward_function_done(self, function: Any) -> None:
        """Chainer's postprocess of a forward function: only the timed op's closes its window."""
        if self._timing is not None and getattr(function, TAG, None) == (
                self.executor._serial, self._timing[0]):
            self._stop()

    def forward_resolved(self, index: int, function: Any, in_data: tuple | None) -> None:
        began = time.perf_counter()
        self._saved[index] = self._saved_bytes(function, index)
        if in_data is not None:
            call = conv_call(function, in_data)
            if call is not None:
                self._conv_calls[index] = call
            self._time_rerun(index, function, in_data)
        if self.encodings:
            self._measure_encodings(index, function)
        self._own_s += time.perf_counter() - began

    def backward_began(self, index: int, fwd_index: int, out_grad: tuple = ()) -> None:
        call = self._conv_calls.get(fwd_index)
        if call is not None and out_grad and out_grad[0] is not None:
            # the gradient's layout, so the split's checks are made on it while profiling
            self._conv_calls[fwd_index] = with_gradient(call, out_grad[0])
        if out_grad:
            held = tuple(-1 if g is None else buffer_bytes(g) for g in out_grad)
            before = self._grad_bytes.get(fwd_index, held)   # a later pass: the most
            self._grad_bytes[fwd_index] = tuple(map(max, before, held))
        self._bwd_timers[fwd_index] = (index, self._start(index))

    def backward_function_done(self) -> None:
        self._stop()

    def backward_complete(self, every_pass: bool = False) -> None:
        """The first backward pass returned (``every_pass``: every one before the update did):
        what the device holds now is the model's, what the user's code holds, and what the
        graph keeps (``IterationSample.end``)."""
        executor = self.executor
        counter = getattr(executor.device, "counter", None)
        if counter is not None:
            gc.collect(1)   # what stays held, not the young cyclic garbage a collection frees
            trace = executor.trace
            self._end = (len(trace.ops) + len(trace.backward_order),
                         executor.device.held(counter.live()), every_pass)
            if not every_pass:
                self._tail_upper, self._tail_host = 0, executor.maps.absent_bytes()
        if not every_pass:
            self._grads_after_first = self.executor.gradients_held()

    def revisit_began(self) -> None:
        """A later backward pass reaches another op: the stretch before it held at most its
        peak and the maps off the device as it began, after the restores its op made (a
        later pass only brings maps back; a map restored there is in that peak already: it
        had been counted twice, 0.26 MB of a user's GAN's 1.2 MB over-refusal)."""
        if self._stale is None and self._grads_after_first is not None:
            self._stale = self._grads_after_first - self.executor.gradients_held()
        if self._measuring_tail():
            device = self.executor.device
            self._tail_upper = max(self._tail_upper,
                                   device.held(device.counter.window()) + self._tail_host)

    def revisit_restored(self) -> None:
        """The op a later pass reached has what it reads back: the next stretch begins."""
        if self._measuring_tail():
            self._tail_host = self.executor.maps.absent_bytes()

    def _measuring_tail(self) -> bool:
        """Whether later passes are measured stretch by stretch: memory counted, the first
        pass over, no op timed."""
        return (getattr(self.executor.device, "counter", None) is not None
                and self._end is not None and self._timing is None)

    def iteration_ending(self) -> None:
        self._stop()

    def compacted(self, n_ops: int, n_tensors: int) -> None:
        """A leading forward-only pass left the iteration: its measurements go with it, but
        for the most the device held in it (a frozen encoder cut off by ``.array``, which
        every iteration runs again: IterationSample.head_peak)."""
        self._dropped_peak = max([self._dropped_peak] + [
            v for k, v in (*self._gaps.items(), *self._inside.items()) if k < n_ops])
        if self.executor.iteration == 0 and self._dropped_peak:
            self.head_rise = self._dropped_peak - self._start_held
        self._fwd_timers = {k - n_ops: v for k, v in self._fwd_timers.items() if k >= n_ops}
        self._scratch = {k - n_ops: v for k, v in self._scratch.items() if k >= n_ops}
        self._nonzero = {t - n_tensors: v for t, v in self._nonzero.items() if t >= n_tensors}
        self._entry = {k - n_ops: v for k, v in self._entry.items() if k >= n_ops}
        self._gaps = {k - n_ops: v for k, v in self._gaps.items() if k >= n_ops}
        self._inside = {k - n_ops: v for k, v in self._inside.items() if k >= n_ops}
        self._conv_calls = {k - n_ops: v for k, v in self._conv_calls.items() if k >= n_ops}
        self._saved = {k - n_ops: v for k, v in self._saved.items() if k >= n_ops}
        self._rerun_timers = {k - n_ops: v for k, v in self._rerun_timers.items() if k >= n_ops}
        self._own_before = {k - n_ops: v for k, v in self._own_before.items() if k >= n_ops}
        self.log.events = [(seq, op - n_ops if op >= 0 else op, kind, nbytes,
                            tensor - n_tensors if tensor >= 0 else tensor, key)
                           for seq, op, kind, nbytes, tensor, key in self.log.events
                           if op < 0 or op >= n_ops]
        if self._timing is not None:
            window, timer = self._timing
            self._timing = (window - n_ops, timer)
            self.log.op = window - n_ops

    def forward_only_dropped(self) -> None:
        self.log.clear()

    def collect(self, trace: GraphTrace) -> None:
        """The iteration ended: its sample (a training iteration PoocH can plan only)."""
        self.last_sample = None
        if trace.backward_order and not trace.unsupported:
            with self.executor.device.host_side():     # the profiler's data is not the device's
                self.last_sample = self.current_sample(trace)
            self.samples.append(self.last_sample)
            del self.samples[:-KEEP_SAMPLES]
        self.log.clear()

    # ------------------------------------------------------------ measurements
    def _time_rerun(self, index: int, function: Any, in_data: tuple) -> None:
        """Time a recomputation of this op, as the executor would run it, on the op's own
        inputs (a BatchNormalization reapplies its stored statistics: a third of its forward).
        What the rerun makes is dropped and the node's state put back, apart from the budget
        and the peak, and unlogged: the iteration goes on as if it never ran. (Under the GPU
        pool's limit a rerun's second output ran out of memory in every budgeted run: H200.)"""
        if type(function).__name__ not in RECOMPUTABLE:
            return
        device = self.executor.device
        state = dict(vars(function))
        timer = device.timer()
        logging, self.log.enabled = self.log.enabled, False
        try:
            with device.apart():
                timer.start()
                recompute(function, in_data)
                timer.stop()
            self._rerun_timers[index] = timer
        except RecomputeError:
            pass                    # not recomputable here (cuDNN BatchNorm): never rerun
        finally:
            self.log.enabled = logging
            vars(function).clear()
            vars(function).update(state)

    def _measure_encodings(self, index: int, function: Any) -> None:
        """Each output's nonzero fraction, and (on a few ReLU outputs an iteration) the
        codecs' times: what the planner's encodings need, outside the device's count."""
        executor = self.executor
        device = executor.device
        relu = type(function).__name__ == "ReLU"
        logging, self.log.enabled = self.log.enabled, False
        try:
            with device.apart():       # (on a GPU the counts and codecs make device arrays)
                for t in executor.trace.ops[index].outputs:
                    array = executor.maps.array_of(t)
                    if array is None or array.dtype.kind != "f" or not array.size:
                        continue
                    self._nonzero[t] = float(codecs.nonzero_bits(array).sum()) / array.size
                    if relu and self._codecs_timed < CODEC_TIMINGS:
                        self._codecs_timed += 1
                        for codec in self.encodings:
                            self._codec_s.setdefault(codec, []).append(
                                codecs.timed_round_trip(codec, array, device.synchronize))
        finally:
            self.log.enabled = logging

    def _saved_bytes(self, function: Any, index: int) -> int:
        """Bytes of arrays the function node keeps beyond its inputs, outputs and the model's."""
        executor = self.executor
        op = executor.trace.ops[index]
        exclude = set(self._model_ids)
        for t in op.inputs + op.outputs:
            array = executor.maps.array_of(t)
            if array is not None:
                exclude.add(id(base_of(array)))
        return sum(int(base.nbytes) for _, _, base in node_state(function, exclude))

    def current_sample(self, trace: GraphTrace) -> IterationSample:
        """What the iteration in progress measured so far (after its backward: all of it)."""
        executor = self.executor
        device = executor.device
        device.synchronize()
        sample = IterationSample(executor.iteration, trace)
        sample.forward_s = {k: t.seconds() for k, t in self._fwd_timers.items()}
        sample.backward_s = {k: t.seconds() for k, (_, t) in self._bwd_timers.items()}
        sample.saved_bytes = dict(self._saved)
        sample.gradient_bytes = dict(self._grad_bytes)
        sample.conv_calls = dict(self._conv_calls)
        sample.splits = dict(executor.stats.splits)
        sample.rerun_s = {k: t.seconds() for k, t in self._rerun_timers.items()}
        sample.gap_s = _gaps([(k, t) for k, t in self._fwd_timers.items()] +
                             [(j, t) for j, t in self._bwd_timers.values()], self._own_before)
        counts = getattr(device, "counter", None) is not None
        sample.scratch = dict(self._scratch) if counts else scratch_bytes(self.log.events)
        for tensor, transfer in executor.stats.transfers:
            out_s, in_s = device.transfer_seconds(transfer)
            if out_s is not None:
                sample.swap_out_s.setdefault(tensor, []).append(out_s)
                sample.transfers.append(("d2h", transfer.nbytes, out_s))
            if in_s is not None:
                sample.swap_in_s.setdefault(tensor, []).append(in_s)
                sample.transfers.append(("h2d", transfer.nbytes, in_s))
        sample.allocations = list(self.log.events)
        if counts:
            # from the end of the op before to the op's own end (its boundary's actions too)
            sample.peak_bytes = {w: max(inside, self._gaps.get(w, 0))
                                 for w, inside in self._inside.items()}
            sample.entry_bytes = dict(self._entry)
            sample.gap_bytes = dict(self._gaps)
            sample.inside_bytes = dict(self._inside)
            if self._timing is None:
                # later passes of a first iteration ran with maps swapped out (on demand),
                # which a planned iteration that keeps them for those passes holds as well
                # (also those no later pass read: leaving them out had a user's small GAN
                # accepted 1.4% short, tests/test_later_iterations.py)
                tail = sample.after_last_op = device.held(device.counter.window())
                later_passes = self._end is not None and self._end[2]
                sample.tail_peak = max(self._tail_upper, tail + self._tail_host) \
                    if later_passes else tail
        sample.schedule = self._ran_schedule()
        sample.nonzero = dict(self._nonzero)
        sample.codec_s = {codec: list(values) for codec, values in self._codec_s.items()}
        sample.end = self._end
        sample.first = executor.iteration == 0
        head = max(executor.head_peak if sample.first else 0, self._dropped_peak)
        sample.head_peak = head if counts and (sample.first or head) else None
        sample.stale_gradients = set(self._stale or ())
        return sample

    def _ran_schedule(self) -> Any:
        """What this iteration did to feature maps, as a schedule (None when it ran passively:
        then plain Chainer did, unobserved)."""
        executor = self.executor
        if executor.passive:
            return None
        b, a, t, s, w = zip(*executor.executed) if executor.executed else ((),) * 5
        return pd.DataFrame({"boundary": np.asarray(b, np.int64),
                             "order": np.arange(len(b), dtype=np.int64),
                             "action": list(a), "tensor": np.asarray(t, np.int64),
                             "seconds": np.asarray(s, float), "waited": np.asarray(w, bool)})


def _gaps(timers: list[tuple[int, Any]], own_before: dict[int, float] | None = None
          ) -> dict[int, float]:
    """Per op window, the wall time since the window that ended before it started (none for
    the first: what precedes it is the loop's, not the iteration's), less the profiler's own
    seconds ``own_before`` that window (work a planned iteration does not do); {} for device
    timers."""
    if not timers or not hasattr(timers[0][1], "start_t"):
        return {}
    own_before = own_before or {}
    ordered = sorted(timers, key=lambda item: item[1].start_t)
    return {window: max(0.0, timer.start_t - before.end_t - own_before.get(window, 0.0))
            for (_, before), (window, timer) in zip(ordered, ordered[1:])}
