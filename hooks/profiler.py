"""Profiler: measure real training iterations and turn them into a measured Profile.

The profiler is the executor with stopwatches: while ``measuring`` it times every forward and
backward op (CUDA events on the GPU, the wall clock on the host), records the device's
malloc/free events per op (hooks/allocator.py) and the bytes each function keeps for its
backward (BatchNormalization statistics, Dropout mask, pooling argmax), and times every
swap-out and swap-in by the real copies. As in the paper (4.2) the profiled iterations run with
every feature map swapped, so a network that does not fit the device can still be profiled;
the plan that does so is whatever ``use(...)`` was given (PoocH passes the swap-all schedule).

``build_profile`` makes the measured Profile (the same contract as the analytic one, through
``GraphTrace.to_builder``): op times are medians over the samples after the first (a warm-up),
scratch sizes the largest seen, swap times the medians of the measured copies (the link preset
on the CPU device) and ``link`` a fit of those copies.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pandas as pd

from pooch_ext.errors import ProfileError
from pooch_ext.hooks.allocator import AllocationLog, cupy_memory_hook, scratch_bytes
from pooch_ext.hooks.model_state import base_of, is_array, model_arrays
from pooch_ext.hooks.executor import Executor
from pooch_ext.hooks.graph import _TAG
from pooch_ext.trace import GraphTrace
from pooch_ext.hooks.recompute import RecomputeError, recompute
from pooch_ext.hooks.runtime_device import RuntimeDevice
from pooch_ext.links import Link
from pooch_ext.profile import Device, Profile
from pooch_ext.functions import RECOMPUTABLE


@dataclass
class IterationSample:
    """What one measured iteration showed."""

    iteration: int
    trace: GraphTrace
    forward_s: dict[int, float] = field(default_factory=dict)     # forward op -> seconds
    backward_s: dict[int, float] = field(default_factory=dict)    # forward op -> its backward
    saved_bytes: dict[int, int] = field(default_factory=dict)     # forward op -> bytes kept
    scratch: dict[int, int] = field(default_factory=dict)         # op (fwd or bwd index) -> bytes
    swap_out_s: dict[int, list[float]] = field(default_factory=dict)
    swap_in_s: dict[int, list[float]] = field(default_factory=dict)
    transfers: list[tuple[str, int, float]] = field(default_factory=list)  # (dir, bytes, s)
    allocations: list[tuple] = field(default_factory=list)
    # the device's measured peak (bytes) per op, from the end of the op before it (so the
    # actions at its boundary count) to its own end; only where the device counts allocations
    peak_bytes: dict[int, int] = field(default_factory=dict)
    schedule: pd.DataFrame | None = None    # what it did to feature maps (None: passive)
    # host seconds between the op before's end and this op's start (wall-clock timers only):
    # Chainer's and the model's Python between functions, PoocH's hooks and actions
    # (the profiler's own bookkeeping and rerun timings left out)
    gap_s: dict[int, float] = field(default_factory=dict)
    rerun_s: dict[int, float] = field(default_factory=dict)   # forward op -> its recompute


class Profiler(Executor):
    """An Executor that, while ``measuring``, records IterationSamples in ``samples``."""

    name = "PoochProfiler"

    def __init__(self, model: Any, device: RuntimeDevice, keep_traces: int = 4,
                 on_deviation: Callable[[str], None] | None = None,
                 iteration_done: Callable[[GraphTrace], None] | None = None,
                 backward_done: Callable[[GraphTrace], None] | None = None,
                 link_added: Callable[[Any], None] | None = None) -> None:
        super().__init__(model, device, keep_traces, on_deviation, iteration_done, backward_done,
                         link_added)
        self.measuring = False
        self.samples: list[IterationSample] = []   # the most recent measured iterations
        self.last_sample: IterationSample | None = None   # of the iteration that just ended
        self.log = AllocationLog()
        self._cupy_hook = None
        self._fwd_timers: dict[int, Any] = {}
        self._bwd_timers: dict[int, tuple[int, Any]] = {}
        self._saved: dict[int, int] = {}
        self._rerun_timers: dict[int, Any] = {}
        self._model_ids: set[int] = set()
        self._timing: tuple[int, Any] | None = None   # (op window, timer) running now
        # the profiler's own host seconds since the last op window ended (bookkeeping, rerun
        # timings: work the executor does not do), and per window what preceded its start
        self._own_s = 0.0
        self._own_before: dict[int, float] = {}

    # ------------------------------------------------------------ switching
    def start_measuring(self) -> None:
        if self.measuring:
            return
        self.measuring = True
        self.timed_transfers = True
        self.log.enabled = True
        if self.trace is not None and self.model is not None:   # from the op starting now
            self._model_ids = model_arrays(self.model)
        if self.device.kind == "cuda":
            self._cupy_hook = cupy_memory_hook(self.log)
            self._cupy_hook.__enter__()
        else:
            self.device.listener = self.log.record

    def stop_measuring(self) -> None:
        if not self.measuring:
            return
        self.measuring = False
        self.timed_transfers = False
        self.log.enabled = False
        self.log.clear()
        if self._cupy_hook is not None:
            self._cupy_hook.__exit__(None, None, None)
            self._cupy_hook = None
        self.device.listener = None

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self.stop_measuring()

    # ------------------------------------------------------------ timing
    def _start(self, window: int) -> Any:
        began = time.perf_counter()
        timer = self.device.timer()
        self.log.op = window
        self._timing = (window, timer)
        counter = getattr(self.device, "counter", None)
        if counter is not None:
            self._gap_peak = counter.window()   # since the op before ended: this boundary
            self._window_live = counter.live()
            counter.reset_window()
        self._own_before[window] = self._own_s + (time.perf_counter() - began)
        self._own_s = 0.0
        timer.start()
        return timer

    def _stop(self) -> None:
        if self._timing is not None:
            self._timing[1].stop()
            began = time.perf_counter()
            counter = getattr(self.device, "counter", None)
            if counter is not None:   # what the op allocated and freed again inside itself
                inside = counter.window()
                scratch = inside - max(self._window_live, counter.live())
                window = self._timing[0]
                self._scratch[window] = max(self._scratch.get(window, 0), scratch)
                self._peaks[window] = max(self._peaks.get(window, 0),
                                          self.device.held(max(inside, self._gap_peak)))
                counter.reset_window()
            self._timing = None
            self.log.op = -1
            self._own_s += time.perf_counter() - began

    def on_iteration_start(self) -> None:
        super().on_iteration_start()
        self._fwd_timers = {}
        self._bwd_timers = {}
        self._saved = {}
        self._rerun_timers = {}
        self._own_s = 0.0
        self._own_before = {}
        self._scratch: dict[int, int] = {}    # op window -> measured scratch bytes
        self._peaks: dict[int, int] = {}      # op window -> measured device peak
        self._gap_peak = 0
        if self.measuring:
            self._model_ids = model_arrays(self.model) if self.model is not None else set()

    def on_forward_begin(self, index: int, function: Any) -> None:
        super().on_forward_begin(index, function)
        if self.measuring:
            self._fwd_timers[index] = self._start(index)

    def forward_postprocess(self, function: Any, in_data: tuple) -> None:
        # only the timed op's own postprocess closes its window
        if self._timing is not None and getattr(function, _TAG, None) == (self._serial,
                                                                         self._timing[0]):
            self._stop()
        super().forward_postprocess(function, in_data)

    def on_forward_resolved(self, index: int, function: Any) -> None:
        in_data = self._pending_in_data
        super().on_forward_resolved(index, function)
        if self.measuring:
            began = time.perf_counter()
            self._saved[index] = self._saved_bytes(function, index)
            if in_data is not None:
                self._time_rerun(index, function, in_data)
            self._own_s += time.perf_counter() - began

    def _time_rerun(self, index: int, function: Any, in_data: tuple) -> None:
        """Time a recomputation of this op, as the executor would run it, on the op's own
        inputs (a BatchNormalization reapplies its stored statistics: a third of its forward).
        What the rerun makes is dropped and the node's state put back, uncounted and unlogged:
        the iteration goes on as if it never ran."""
        if type(function).__name__ not in RECOMPUTABLE:
            return
        state = dict(vars(function))
        timer = self.device.timer()
        logging, self.log.enabled = self.log.enabled, False
        try:
            with self.device.host_side():
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

    def on_backward_begin(self, index: int, fwd_index: int, function: Any) -> None:
        super().on_backward_begin(index, fwd_index, function)
        if self.measuring:
            self._bwd_timers[fwd_index] = (index, self._start(index))

    def backward_postprocess(self, function: Any, in_data: tuple, out_grad: tuple) -> None:
        if self._timing is not None and self._in_backward:
            self._stop()
        super().backward_postprocess(function, in_data, out_grad)

    def _saved_bytes(self, function: Any, index: int) -> int:
        """Bytes of arrays the function node keeps beyond its inputs, outputs and the model's."""
        op = self.trace.ops[index]
        exclude = set(self._model_ids)
        for t in op.inputs + op.outputs:
            array = self.array_of(t)
            if array is not None:
                exclude.add(id(base_of(array)))
        total = 0
        for name, value in vars(function).items():
            if name in ("inputs", "outputs") or not is_array(value):
                continue
            base = base_of(value)
            if id(base) not in exclude:
                exclude.add(id(base))
                total += int(base.nbytes)
        return total

    def on_iteration_end(self, trace: GraphTrace) -> None:
        self._stop()
        super().on_iteration_end(trace)

    def on_compact(self, n_ops: int, n_tensors: int) -> None:
        """A leading forward-only pass left the iteration: its measurements go with it."""
        super().on_compact(n_ops, n_tensors)
        self._fwd_timers = {k - n_ops: v for k, v in self._fwd_timers.items() if k >= n_ops}
        self._scratch = {k - n_ops: v for k, v in self._scratch.items() if k >= n_ops}
        self._peaks = {k - n_ops: v for k, v in self._peaks.items() if k >= n_ops}
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

    def on_forward_only(self, trace: GraphTrace) -> None:
        super().on_forward_only(trace)
        self.log.clear()

    def current_sample(self, trace: GraphTrace) -> IterationSample:
        """What the iteration in progress measured so far (after its backward: all of it)."""
        self.device.synchronize()
        sample = IterationSample(self.iteration, trace)
        sample.forward_s = {k: t.seconds() for k, t in self._fwd_timers.items()}
        sample.backward_s = {k: t.seconds() for k, (_, t) in self._bwd_timers.items()}
        sample.saved_bytes = dict(self._saved)
        sample.rerun_s = {k: t.seconds() for k, t in self._rerun_timers.items()}
        sample.gap_s = _gaps([(k, t) for k, t in self._fwd_timers.items()] +
                             [(j, t) for j, t in self._bwd_timers.values()], self._own_before)
        sample.scratch = (dict(self._scratch) if getattr(self.device, "counter", None) is not None
                          else scratch_bytes(self.log.events))
        for tensor, transfer in self.stats.transfers:
            out_s, in_s = self.device.transfer_seconds(transfer)
            if out_s is not None:
                sample.swap_out_s.setdefault(tensor, []).append(out_s)
                sample.transfers.append(("d2h", transfer.nbytes, out_s))
            if in_s is not None:
                sample.swap_in_s.setdefault(tensor, []).append(in_s)
                sample.transfers.append(("h2d", transfer.nbytes, in_s))
        sample.allocations = list(self.log.events)
        if getattr(self.device, "counter", None) is not None:
            sample.peak_bytes = dict(self._peaks)
        sample.schedule = self._ran_schedule()
        return sample

    def _ran_schedule(self) -> Any:
        """What this iteration did to feature maps, as a schedule (None when it ran passively:
        then plain Chainer did, unobserved)."""
        if self.passive:
            return None
        b, a, t, s, w = zip(*self.executed) if self.executed else ((),) * 5
        return pd.DataFrame({"boundary": np.asarray(b, np.int64),
                             "order": np.arange(len(b), dtype=np.int64),
                             "action": list(a), "tensor": np.asarray(t, np.int64),
                             "seconds": np.asarray(s, float), "waited": np.asarray(w, bool)})

    def collect(self, trace: GraphTrace) -> None:
        self.last_sample = None
        if self.measuring and trace.backward_order and not trace.unsupported:
            with self.device.host_side():     # the profiler's data is not the device's
                self.last_sample = self.current_sample(trace)
            self.samples.append(self.last_sample)
            del self.samples[:-16]
        self.stats.transfers = []
        self.log.clear()


# ---------------------------------------------------------------------------------- profile

def fit_link(samples: list[IterationSample], name: str = "measured") -> Link | None:
    """latency + bytes / bandwidth fitted to the measured copies (None without copies)."""
    fitted = {}
    for direction in ("d2h", "h2d"):
        points = np.array([(b, s) for sample in samples for d, b, s in sample.transfers
                           if d == direction and b > 0 and s > 0], float)
        if len(points) == 0:
            return None
        nbytes, seconds = points[:, 0], points[:, 1]
        slope, latency = (np.polyfit(nbytes, seconds, 1) if len(set(nbytes)) > 1
                          else (seconds.sum() / nbytes.sum(), 0.0))
        if slope <= 0:
            slope, latency = seconds.sum() / nbytes.sum(), 0.0
        fitted[direction] = (1.0 / slope, max(0.0, float(latency)))
    latency = (fitted["d2h"][1] + fitted["h2d"][1]) / 2
    return Link(name, fitted["d2h"][0], fitted["h2d"][0], latency)


# a few KiB vary between iterations and plans (BatchNormalization's running statistics made
# anew, index arrays, 0-d results): measured per-op peaks of a planned run exceeded the
# calibrated prediction by up to 3.6 KiB on small-resnet; every op is allowed this much more
SLACK_BYTES = 8 * 1024


def unmodelled_bytes(profile: Profile, samples: list[IterationSample]) -> dict[int, int]:
    """Per op, the most bytes by which the measured peak exceeded the graph model's for the
    schedule the iteration ran (only samples that ran one whole, on a device that counts its
    allocations). What the model misses is Chainer's gradient bookkeeping: the backward loop
    holds an op's inputs and output gradients until the next op starts, accumulates a
    gradient used twice through a temporary sum, keeps parameter gradients in its table until
    backward ends, and lets Add / Reshape / Concat hand out views of one gradient. None of it
    depends on which maps are kept, swapped or recomputed (measured: the same per-op excess
    under in-core, swap-all and sqrt-n plans), so adding it to the op's transient bytes makes
    every plan's predicted peak the measured one (tests/test_memory_fidelity.py)."""
    from pooch_ext.sim.check import schedule_memory

    excess: dict[int, int] = {}
    maps = set(profile.feature_maps["tensor"].tolist())
    for sample in samples:
        if not sample.peak_bytes or sample.schedule is None:
            continue
        ran = sample.schedule
        # maps the model classifies, at the graph's boundaries (others are modelled events)
        schedule = ran[ran["tensor"].isin(maps) & (ran["boundary"] <= profile.n_ops)]
        predicted = schedule_memory(profile, schedule)["peak_bytes"].to_numpy()
        for op, measured in sample.peak_bytes.items():
            if 0 <= op < len(predicted) - 1:
                excess[op] = max(excess.get(op, 0), int(measured - predicted[op]) + SLACK_BYTES)
    return {op: nbytes for op, nbytes in excess.items() if nbytes > 0}


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


def runtime_seconds(samples: list[IterationSample], n_fwd: int) -> dict[int, float]:
    """Per op, the host time between ops that neither the op windows nor the schedule's actions
    take (Python in Chainer and the model, PoocH's hooks): the median over the samples of the
    gap before it less the seconds of the actions run in that gap; where an action went
    untimed (done on demand), the median such time of its phase. On a CPU this is compute
    time like any other (on a GPU the host runs ahead: no wall-clock gaps there)."""
    clean: dict[int, list[float]] = {}
    for sample in samples:
        acted: dict[int, float] = {}
        if sample.schedule is not None:
            ran = sample.schedule
            acted = ran.groupby("boundary")["seconds"].agg(
                lambda v: v.sum() if v.notna().all() else math.nan).to_dict()
        for op, seconds in sample.gap_s.items():
            spent = acted.get(op, 0.0)
            if spent == spent:          # not NaN: every action in the gap was timed
                clean.setdefault(op, []).append(max(0.0, seconds - spent))
    ops = {op for sample in samples for op in sample.gap_s}
    phase = {forward: _median([v for op, vs in clean.items() for v in vs
                               if (op < n_fwd) == forward]) for forward in (True, False)}
    return {op: _median(clean[op]) if op in clean else phase[op < n_fwd] for op in ops}


def action_seconds(samples: list[IterationSample]) -> dict[str, float]:
    """Per schedule action kind, the median host seconds the executor spent on one, over the
    timed actions that found their copy landed (a wait's length is the simulator's to
    predict, from the copy times); {} when no sample ran a schedule on a host clock."""
    if not any(s.gap_s for s in samples):
        return {}           # device timers: the host's time is not the iteration's
    ran = [s.schedule for s in samples if s.schedule is not None and len(s.schedule)]
    if not ran:
        return {}
    actions = pd.concat(ran, ignore_index=True)
    actions = actions[~actions["waited"] & actions["seconds"].notna()]
    return {str(kind): float(seconds.median())
            for kind, seconds in actions.groupby("action")["seconds"]}


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def cleared_gradients(trace: GraphTrace, samples: list[IterationSample]
                      ) -> list[tuple[int, list[int], bool]]:
    """(bytes, forward ops reading it, held in forward) of each parameter gradient that no
    sample still held as backward began: the loop cleared it, so it is not resident (measured:
    an LSTM's recurrent weights' gradients are 20% of its peak, absent until their first
    backward op). A gradient held at any sample's backward, or of a parameter some sample read
    differently, stays resident: never less memory than the model had before."""
    readers: dict[int, list[int]] = {}
    for op in trace.ops:
        for p in op.param_ids:
            readers.setdefault(p, []).append(op.index)
    cleared = []
    for p, ops in sorted(readers.items()):
        records = [s.trace.params[p] for s in samples if p < len(s.trace.params)]
        if len(records) != len(samples) or any(r.nbytes != records[0].nbytes or r.grad_in_backward
                                               for r in records):
            continue
        cleared.append((records[0].nbytes, ops, any(r.grad_in_forward for r in records)))
    return cleared


def _use_measured_swap_times(profile: Profile, use: list[IterationSample]) -> None:
    """Each map's swap-out and swap-in time: the median of its measured copies, where any."""
    tensors = profile.tensors
    for column in ("swap_out_s", "swap_in_s"):
        measured: dict[int, list[float]] = {}
        for s in use:
            for t, values in getattr(s, column).items():
                measured.setdefault(t, []).extend(values)
        values = [(_median(measured[t]) if t in measured else v)
                  for t, v in zip(tensors["tensor"], tensors[column])]
        tensors[column] = np.asarray(values, float)


def build_profile(samples: list[IterationSample], device: Device, link: Link, resident: int,
                  meta: dict | None = None, measured_swaps: bool = True) -> Profile:
    """The measured Profile of ``samples`` (all of one graph); the first is a warm-up when there
    are two or more. ``measured_swaps``: take swap times from the copies, else from ``link``."""
    if not samples:
        raise ProfileError("no profiled iteration to build a profile from")
    use = samples[1:] if len(samples) > 1 else samples
    trace = use[-1].trace
    signature = trace.signature()
    if any(s.trace.signature() != signature for s in use):
        raise ProfileError("the profiled iterations ran different graphs")
    n_fwd = len(trace.ops)
    bwd_index = {k: n_fwd + j for j, k in enumerate(trace.backward_order)}

    unmodelled: dict[int, int] = {}      # op -> measured bytes the graph model lacks
    between = runtime_seconds(use, n_fwd)

    def cost(_trace: GraphTrace, op: Any) -> dict:
        k = op.index
        j = bwd_index.get(k, -1)
        return dict(
            duration_s=_median([s.forward_s[k] for s in use if k in s.forward_s]),
            rerun_s=(_median([s.rerun_s[k] for s in use if k in s.rerun_s])
                     if any(k in s.rerun_s for s in use) else None),
            backward_s=_median([s.backward_s[k] for s in use if k in s.backward_s]),
            transient_bytes=max([s.scratch.get(k, 0) for s in use]) + unmodelled.get(k, 0),
            backward_transient_bytes=(max([s.scratch.get(j, 0) for s in use])
                                      + unmodelled.get(j, 0)) if j >= 0 else 0,
            saved_bytes=int(_median([s.saved_bytes.get(k, 0) for s in use])))

    info = dict(meta or {})
    info.setdefault("source", "measured")
    info["profiled_iterations"] = [s.iteration for s in samples]
    info["measured_iterations"] = [s.iteration for s in use]
    info["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")

    cleared = cleared_gradients(trace, use)
    if cleared:
        info["cleared_gradients"] = dict(arrays=len(cleared),
                                         bytes=sum(nbytes for nbytes, _, _ in cleared))

    def build() -> Profile:
        builder = trace.to_builder(device, link, cost, info)
        builder.resident(resident - sum(nbytes for nbytes, _, _ in cleared))
        for nbytes, readers, in_forward in cleared:
            builder.parameter_gradient(nbytes, readers, in_forward)
        return builder.build(loss=trace.loss, backward_order=trace.backward_order)

    profile = build()
    unmodelled.update(unmodelled_bytes(profile, use))
    if unmodelled:
        info["unmodelled_bytes"] = [list(item) for item in sorted(unmodelled.items())]
        profile = build()
    if measured_swaps:
        _use_measured_swap_times(profile, use)
    if between:
        profile.ops["runtime_s"] = [between.get(int(op), 0.0) for op in profile.ops["op"]]
    profile.action_s = action_seconds(use)
    return profile
