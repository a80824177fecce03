"""The measured Profile: what profiled iterations showed (``IterationSample``, filled by
hooks/profiler.py) turned into the same contract as the analytic profile, through
``GraphTrace.to_builder``.

Op times (forward, backward, re-run for recomputation) are the least over the samples after
the first (a warm-up): interference from a shared machine or the copy threads only adds time,
and with two samples a median is their mean, half of any slow spell (on the CPU device that
put predictions 6-7% above the measured times at the median, 2% with the least). Scratch sizes
and the bytes a gradient holds (a broadcast view's fewer) are the largest seen, swap times the
medians of the measured copies (the CPU device: its link preset's), ``link`` a fit of them;
the bytes the graph model misses, the host seconds between ops and per action too.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import pandas as pd

from pooch_ext.errors import ProfileError
from pooch_ext.links import Link
from pooch_ext.profile import Device, Profile
from pooch_ext.hooks.later_iterations import carried_bytes, later_gaps
from pooch_ext.sim.model import HELD_BETWEEN_OPS
from pooch_ext.trace import GraphTrace


@dataclass
class IterationSample:
    """What one measured iteration showed."""

    iteration: int
    trace: GraphTrace
    forward_s: dict[int, float] = field(default_factory=dict)     # forward op -> seconds
    backward_s: dict[int, float] = field(default_factory=dict)    # forward op -> its backward
    saved_bytes: dict[int, int] = field(default_factory=dict)     # forward op -> bytes kept
    # forward op -> per output, its gradient's bytes as the op's backward began (-1: none)
    gradient_bytes: dict[int, tuple[int, ...]] = field(default_factory=dict)
    scratch: dict[int, int] = field(default_factory=dict)         # op (fwd or bwd index) -> bytes
    swap_out_s: dict[int, list[float]] = field(default_factory=dict)
    swap_in_s: dict[int, list[float]] = field(default_factory=dict)
    transfers: list[tuple[str, int, float]] = field(default_factory=list)  # (dir, bytes, s)
    allocations: list[tuple] = field(default_factory=list)
    # the device's measured peak (bytes) per op, from the end of the op before it (so the
    # actions at its boundary count) to its own end; only where the device counts allocations
    peak_bytes: dict[int, int] = field(default_factory=dict)
    entry_bytes: dict[int, int] = field(default_factory=dict)   # op -> bytes held as it starts
    gap_bytes: dict[int, int] = field(default_factory=dict)     # op -> peak just before it
    inside_bytes: dict[int, int] = field(default_factory=dict)  # op -> peak inside it
    schedule: pd.DataFrame | None = None    # what it did to feature maps (None: passive)
    # host seconds between the op before's end and this op's start (wall-clock timers only):
    # Chainer's and the model's Python between functions, PoocH's hooks and actions
    # (the profiler's own bookkeeping and rerun timings left out)
    gap_s: dict[int, float] = field(default_factory=dict)
    rerun_s: dict[int, float] = field(default_factory=dict)   # forward op -> its recompute
    conv_calls: dict[int, Any] = field(default_factory=dict)  # forward op -> ConvCall
    splits: dict[int, tuple[int, int]] = field(default_factory=dict)  # forward op -> pieces
    # (forward, backward) it ran in (the program profiling ran split it)
    nonzero: dict[int, float] = field(default_factory=dict)   # tensor -> nonzero fraction
    # codec -> (encode, decode) seconds per byte, one entry per timed map (hooks/codecs.py)
    codec_s: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    # (boundary, device bytes held, every pass) as its first backward pass completed, or
    # (every pass: True) as the update began after more (where the device counts
    # allocations); whether it was the first iteration measured (no earlier graph alive)
    end: tuple[int, int, bool] | None = None
    first: bool = False
    # parameters whose gradient the first pass wrote and the loop cleared before a later one
    # (a GAN's generator: its optimizer clears it before its own pass only), so in a later
    # iteration the earlier passes find the last one's gradient held (``cleared_gradients``)
    stale_gradients: set[int] = field(default_factory=set)
    # the device's peak after its last op window (later backward passes, the update), which
    # a later iteration's first op window takes in
    tail_peak: int | None = None
    # the device's peak from the last op's end on alone (the update, the loop's own code, the
    # next batch made): what no plan governs, which the first updating iteration refuses on
    after_last_op: int | None = None
    # the device's peak before its first op: the first iteration's (a teacher's forward, the
    # batch made), any's in a forward-only pass it dropped; later ones hold the last graph too
    head_peak: int | None = None


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


def unmodelled_bytes(modelled: list[tuple]) -> dict[int, int]:
    """Per op, the most bytes by which the measured peak exceeded the graph model's for the
    schedule the iteration ran (only samples that ran one whole, on a device that counts its
    allocations). What the model misses is Chainer's gradient bookkeeping: the backward loop
    holds an op's inputs and output gradients until the next op starts, accumulates a
    gradient used twice through a temporary sum, keeps parameter gradients in its table until
    backward ends, and lets Add / Reshape / Concat hand out views of one gradient. None of it
    depends on which maps are kept, swapped or recomputed (measured: the same per-op excess
    under in-core, swap-all and sqrt-n plans), so adding it to the op's transient bytes makes
    every plan's predicted peak the measured one (tests/test_memory_fidelity.py)."""
    excess: dict[int, int] = {}
    for sample, predicted, carried in modelled:
        peaks = predicted["peak_bytes"].to_numpy()
        for op, measured in sample.peak_bytes.items():
            if op == 0 and 0 in sample.inside_bytes:
                # the first op's own peak: what the last iteration's tail held before it is
                # ``gap_floors``' (compared with a split op's prediction, the two together
                # counted the split's saving again on the whole op)
                measured = sample.inside_bytes[0]
            if 0 <= op < len(peaks) - 1:
                excess[op] = max(excess.get(op, 0),
                                 int(measured + carried[op] - peaks[op]) + SLACK_BYTES)
    return {op: nbytes for op, nbytes in excess.items() if nbytes > 0}


def gap_floors(profile: Profile, modelled: list[tuple], unrefusable: bool = False
               ) -> dict[int, int]:
    """{0: the most bytes above the model's level at the first op that the device held before
    it began}: the last iteration's tail (its later backward passes, the update, the loop's
    own code), the least transient bytes a profile gives that op, whole or split: a split of
    the op cuts its own scratch, never this (measured: ``chainer.grad`` then ``backward``,
    124 KB before the first convolution of a net whose split configurations promised 88 KB).
    Between later ops the gap is the boundary's actions (a recompute's run), which the model
    has (sim/memory.py rule 4): their peaks stay the ops' (``unmodelled_bytes``)."""
    floors: dict[int, int] = {}
    first = profile.ops.iloc[0]
    for sample, predicted, carried in modelled:
        gap = later_gaps(sample, carried).get(0)
        if gap is None or len(predicted) < 2:
            continue
        if unrefusable:
            # past the first iteration, beyond the budget it is no plan's (an evaluation at
            # four times the batch after each update left a graph the first check had
            # accepted unplanned, every op over): the plan runs the graph within the budget,
            # the excess is recorded as it runs; before, the check refuses the budget
            gap = min(gap, int(profile.device.capacity_bytes) - SLACK_BYTES)
        # the model's peak at the op less the op's own scratch as the sample ran it: what
        # the model holds there anyway (gradients held through forward, the op's output)
        pieces = _ran_configs(profile, sample).get(0, 1)
        own = next((c[1] for c in first["configs"] if c[0] == pieces),
                   first["transient_bytes"])
        held = int(predicted["peak_bytes"].iloc[0]) - int(own)
        floors[0] = max(floors.get(0, 0), int(gap - held) + SLACK_BYTES)
    return {op: nbytes for op, nbytes in floors.items() if nbytes > 0}


def held_between_ops(modelled: list[tuple]) -> dict[int, int]:
    """Per op, the most bytes by which what the device held as the op started exceeded the
    graph model's level there (after the boundary's actions). The bookkeeping
    ``unmodelled_bytes`` adds to an op's transient bytes is partly alive between ops already
    (the backward loop holds an op's inputs and output gradients until the next op starts),
    so a recomputation run at that boundary runs beside it (measured: 3 MB at small-resnet
    b32's BatchNormalization backward, one map over a tight budget); ``sim.model`` adds it to
    a recompute's extra memory there."""
    excess: dict[int, int] = {}
    for sample, predicted, carried in modelled:
        levels = predicted["bytes"].to_numpy()
        for op, measured in sample.entry_bytes.items():
            if 0 <= op < len(levels) - 1:
                excess[op] = max(excess.get(op, 0), int(measured + carried[op] - levels[op]))
    return {op: nbytes for op, nbytes in excess.items() if nbytes > 0}


def _modelled(profile: Profile, samples: list[IterationSample]) -> Iterator[tuple]:
    """(sample, the model's memory of the schedule it ran, bytes per op it lacked of what a
    later iteration carries) for each sample that ran one whole on a device that counts its
    allocations: what ``unmodelled_bytes``, ``gap_floors`` and ``held_between_ops`` read."""
    from pooch_ext.sim.check import schedule_memory

    maps = set(profile.feature_maps["tensor"].tolist())
    for sample in samples:
        if not sample.peak_bytes or sample.schedule is None:
            continue
        ran = sample.schedule    # maps the model classifies, at the graph's boundaries
        schedule = ran[ran["tensor"].isin(maps) & (ran["boundary"] <= profile.n_ops)]
        predicted = schedule_memory(profile, schedule, _ran_configs(profile, sample))
        # gradients the first iteration held through its forward already (Chainer's NaN
        # ones, a loop clearing them after its forward) are not what a later one adds, nor
        # those it cleared before its forward (a later forward holds none either; counted,
        # a user's MLP was refused at 1.41 times what its later iterations need)
        cleared = sum(nbytes for nbytes, _, in_forward, before
                      in cleared_gradients(sample.trace, [sample])
                      if not in_forward and not before) if sample.first else 0
        yield sample, predicted, carried_bytes(profile, sample, predicted, cleared)


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


def _ran_configs(profile: Profile, sample: IterationSample) -> dict[int, int]:
    """op -> pieces the sample ran split ops in, as far as the profile offers them."""
    ops = profile.ops
    bwd = {int(f): int(k) for k, f in zip(ops["op"], ops["fwd_op"]) if f >= 0}
    offered = {int(k): {c[0] for c in cfgs} for k, cfgs in zip(ops["op"], ops["configs"])}
    configs = {}
    for k, (forward, backward) in sample.splits.items():
        for op, pieces in ((k, forward), (bwd.get(k, -1), backward)):
            if pieces in offered.get(op, ()):
                configs[op] = pieces
    return configs


def _split_change(sample: IterationSample, k: int, calls: dict, configs_of: Any
                  ) -> tuple[tuple[int, float], tuple[int, float]]:
    """((bytes, seconds) of forward, the same of backward): what running forward op ``k``
    split in ``sample`` changed against whole, as measured for its configurations."""
    pieces = sample.splits.get(k)
    if pieces is None or k not in calls or configs_of is None:
        return (0, 0.0), (0, 0.0)
    out = []
    for configs, p in zip(configs_of(calls[k]), pieces):
        found = [(d_bytes, d_s) for q, d_bytes, d_s in configs if q == p]
        out.append(found[0] if found else (0, 0.0))
    return out[0], out[1]


def _shifted(changes: list[tuple[int, int, float]], scratch: int, seconds: float) -> list:
    """Configurations from their measured changes to a whole op of ``scratch`` bytes and
    ``seconds``: neither below zero."""
    return [(pieces, max(0, scratch + d_bytes), max(0.0, seconds + d_s))
            for pieces, d_bytes, d_s in changes]


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def _least(values: list[float]) -> float:
    """An op's compute time over the samples: the least (see the module's docstring)."""
    return float(min(values)) if values else 0.0


def cleared_gradients(trace: GraphTrace, samples: list[IterationSample]
                      ) -> list[tuple[int, list[int], bool, bool]]:
    """(bytes, forward ops reading it, held in forward, cleared before the first iteration's
    forward: ParamRecord.cleared_before_forward) of each parameter gradient that no
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
                                               for r in records) \
                or any(p in s.stale_gradients for s in samples):
            continue
        cleared.append((records[0].nbytes, ops, any(r.grad_in_forward for r in records),
                        all(r.cleared_before_forward for r in records)))
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


def _measured_costs(use: list[IterationSample], k: int, j: int, calls: dict,
                    configs_of: Callable[[Any], tuple[list, list]] | None,
                    unmodelled: dict[int, int], tail: tuple[float, int] = (0.0, 0),
                    floor: int = 0) -> dict:
    """The builder's costs of forward op ``k`` (backward op ``j``, -1: none) from the samples
    ``use``: least times, maxima of scratch, each as the whole op would have taken where
    a sample ran it split; with its split configurations where ``configs_of`` offers some.
    ``tail``: (seconds, scratch bytes) run right after the backward op (``build_profile``);
    ``floor``: the least transient bytes of the op, whole or split (``gap_floors``)."""
    change = {s.iteration: _split_change(s, k, calls, configs_of) for s in use}
    # a whole op's time from a split run less the split's measured change: timing noise can
    # take it below zero (a split's change is measured on probes, once), never a real time
    row = dict(
        duration_s=max(0.0, _least([s.forward_s[k] - change[s.iteration][0][1]
                                    for s in use if k in s.forward_s])),
        rerun_s=(_least([s.rerun_s[k] for s in use if k in s.rerun_s])
                 if any(k in s.rerun_s for s in use) else None),
        backward_s=max(0.0, _least([s.backward_s[k] - change[s.iteration][1][1]
                                    for s in use if k in s.backward_s])),
        transient_bytes=max(floor, max([s.scratch.get(k, 0) - change[s.iteration][0][0]
                                        for s in use]) + unmodelled.get(k, 0)),
        backward_transient_bytes=(max([s.scratch.get(j, 0) - change[s.iteration][1][0]
                                       for s in use])
                                  + unmodelled.get(j, 0)) if j >= 0 else 0,
        saved_bytes=int(_median([s.saved_bytes.get(k, 0) for s in use])))
    if all(k in s.gradient_bytes for s in use):    # the most any sample held, per output
        row["output_gradient_bytes"] = [max(v) for v in zip(*(s.gradient_bytes[k] for s in use))]
    row["backward_s"] += tail[0]
    row["backward_transient_bytes"] = max(row["backward_transient_bytes"], tail[1])
    if k in calls and configs_of is not None:
        forward, backward = configs_of(calls[k])
        row["configs"] = [(pieces, max(nbytes, floor), seconds) for pieces, nbytes, seconds
                          in _shifted(forward, row["transient_bytes"], row["duration_s"])]
        if j >= 0:
            row["backward_configs"] = _shifted(backward, row["backward_transient_bytes"],
                                               row["backward_s"])
    return row


def _meta(meta: dict | None, samples: list[IterationSample], use: list[IterationSample],
          after_backward: tuple[float, int] | None) -> dict:
    """The measured profile's meta: the caller's, and which iterations it was measured on."""
    info = dict(meta or {})
    info.setdefault("source", "measured")
    info["profiled_iterations"] = [s.iteration for s in samples]
    info["measured_iterations"] = [s.iteration for s in use]
    info["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    if after_backward is not None:
        info["after_backward"] = dict(seconds=float(after_backward[0]),
                                      scratch_bytes=int(after_backward[1]))
    return info


def build_profile(samples: list[IterationSample], device: Device, link: Link, resident: int,
                  meta: dict | None = None, measured_swaps: bool = True,
                  configs_of: Callable[[Any], tuple[list, list]] | None = None,
                  after_backward: tuple[float, int] | None = None,
                  unrefusable: bool = False) -> Profile:
    """The measured Profile of ``samples`` (all of one graph); the first is a warm-up when there
    are two or more. ``measured_swaps``: take swap times from the copies, else from ``link``.
    ``configs_of(call)``: a profiled convolution's split configurations as changes to its
    whole (hooks/conv_configs.measured_configs); None: no op gets any. ``after_backward``:
    (seconds, scratch bytes) of work every iteration runs right after its last backward op
    (data parallelism's gradient all-reduce), charged to that op: every plan then pays its
    time, and its scratch at the memory level where backward ends. ``unrefusable``: past the
    first iteration, where no budget can be refused any more (``gap_floors``)."""
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
    floors: dict[int, int] = {}          # op -> least transient bytes of its configurations
    between = runtime_seconds(use, n_fwd)
    calls = next((s.conv_calls for s in reversed(use) if s.conv_calls), {}) \
        if configs_of is not None else {}
    last = trace.backward_order[-1] if trace.backward_order else -1

    def cost(_trace: GraphTrace, op: Any) -> dict:
        tail = after_backward if after_backward is not None and op.index == last else (0.0, 0)
        return _measured_costs(use, op.index, bwd_index.get(op.index, -1), calls, configs_of,
                               unmodelled, tail, floors.get(op.index, 0))
    info = _meta(meta, samples, use, after_backward)
    cleared = cleared_gradients(trace, use)
    if cleared:
        info["cleared_gradients"] = dict(arrays=len(cleared),
                                         bytes=sum(c[0] for c in cleared))

    def build() -> Profile:
        builder = trace.to_builder(device, link, cost, info)
        builder.resident(resident - sum(c[0] for c in cleared))
        for nbytes, readers, in_forward, _ in cleared:
            builder.parameter_gradient(nbytes, readers, in_forward)
        return builder.build(loss=trace.loss, backward_order=trace.backward_order)

    profile = build()
    modelled = list(_modelled(profile, use))
    unmodelled.update(unmodelled_bytes(modelled))
    floors.update(gap_floors(profile, modelled, unrefusable))
    if unmodelled or floors:
        if unmodelled:
            info["unmodelled_bytes"] = [list(item) for item in sorted(unmodelled.items())]
        profile = build()
    held = held_between_ops(modelled)    # levels: the rebuild changed only op peaks
    if held:
        profile.meta[HELD_BETWEEN_OPS] = [list(item) for item in sorted(held.items())]
    if measured_swaps:
        _use_measured_swap_times(profile, use)
    if between:
        profile.ops["runtime_s"] = [between.get(int(op), 0.0) for op in profile.ops["op"]]
    profile.action_s = action_seconds(use)
    _encoding_measures(profile, use)
    return profile


def _encoding_measures(profile: Profile, use: list[IterationSample]) -> None:
    """What the encodings need (pooch_ext/encodings.py): each tensor's largest nonzero
    fraction seen, the codecs' median seconds per byte."""
    seen: dict[int, float] = {}
    for sample in use:
        for t, fraction in sample.nonzero.items():
            seen[t] = max(seen.get(t, 0.0), fraction)
    if seen:
        profile.tensors["nonzero"] = [seen.get(int(t), math.nan) for t in profile.tensors["tensor"]]
    rates: dict[str, list[tuple[float, float]]] = {}
    for sample in use:
        for codec, values in sample.codec_s.items():
            rates.setdefault(codec, []).extend(values)
    if rates:
        profile.meta["codec_s_per_byte"] = {
            codec: [_median([v[0] for v in values]), _median([v[1] for v in values])]
            for codec, values in rates.items()}
