"""Timeline simulator: predict time and memory of a plan, and write the schedule that runs it.

Three engines work in parallel, each serial: compute (ops and recomputation), D2H (swap-outs)
and H2D (swap-ins). Memory is a deterministic function of the op sequence and the schedule;
only time is simulated. The simulator walks the op boundaries in order and decides at which
boundary each action happens, from its predicted times:

* a swapped map's swap-out starts at the boundary after its producer; its device copy is
  ``release``d at the first boundary where the copy is predicted done and no forward op reads
  it any more. When an op's memory would not fit, pending swap-outs are released in copy
  order and compute stalls until those copies finish (the executor waits there too);
* swap-ins follow the plan's ``swap_in_timing`` (plan.py): ``early`` (paper 4.3: in order of
  first backward use, each as soon as its swap-out is done and memory has room for it until
  its last use), ``previous-op``, ``previous-conv`` or ``vdnn``; a swap-in that a fixed rule
  places where memory has no room is delayed to the first boundary that has it (counted);
* a recompute-class map is freed after its last forward use and rebuilt by its recompute
  chain right before its first backward need (its sources are needs at that point);
* a backward op (or a recompute) waits for the swap-ins it needs; each stall is attributed
  to the tensor it waited for;
* every action also costs the compute engine the host seconds the runtime spends on it
  (``Profile.action_s``, measured on the CPU device; 0 where not measured).

Memory of an op b is the level at boundary b plus the op's internal peak (its outputs,
gradients and scratch, from the profile's events); the plan fits when that never exceeds the
budget. Feasibility depends only on the classes (lifetimes.static_top): the dynamic choices
always have a tightest fallback (sim/budgets.py answers without simulating; sim/timeline.py
turns a recorded run into the Timeline and the schedule). Host memory (model.host_level)
too: a swapped map holds its bytes on the host from its swap-out to the iteration's end; a
host budget (None: unlimited) bounds that peak (``budgets.minimum_host_budget``: the least).
The searches' runs walk in C (sim/fastwalk.py), bit for bit as the walk here.
"""
from __future__ import annotations

import dataclasses
import math
from collections import deque

import numpy as np

from pooch_ext.links import Link
from pooch_ext.plan import Plan
from pooch_ext.profile import Profile
from pooch_ext.report.classtable import plan_table
from pooch_ext.sim.budgets import resolve_budget, resolve_host_budget
from pooch_ext.sim import fastwalk
from pooch_ext.sim.configs import applied, choose
from pooch_ext.sim.lifetimes import Lifetimes, lifetimes, static_top, swap_waits
from pooch_ext.sim.model import (RECOMPUTE, SWAP, SimModel, codes_of, compile_profile,
                                 compute_to_come, host_level, host_peak, per_search,
                                 swap_in_bound, swap_in_targets)
from pooch_ext.sim.timeline import Recorder, RunResult, Timeline, build_timeline

EPS = 1e-12


# ------------------------------------------------------------------ public API

def simulate(profile: Profile, plan: Plan, link: Link | str | None = None,
             budget: int | str | None = None,
             host_budget: int | str | float | None = None) -> Timeline:
    """How ``plan`` runs on ``profile``: the Timeline (schedule, time, peaks, stalls). The plan
    is left as it is; ``simulate_plan`` gives a copy with the results filled in.

    ``link`` None uses the profile's own swap times, a Link or preset name times from bytes;
    ``budget`` (bytes, or a string such as "16GiB") None is the device capacity;
    ``host_budget`` (the same, 0 allowed) None is unlimited host memory.
    """
    model = compile_profile(profile, link)
    budget_bytes = resolve_budget(profile, budget)
    host_limit = resolve_host_budget(host_budget)
    try:
        fixed = model.configs.index_of(plan.configs) if plan.configs else None
    except ValueError as error:
        raise ValueError(f"plan {plan.policy!r}: {error}") from None
    result = run(model, codes_of(model, plan.classes), plan.swap_in_timing, budget_bytes,
                 record=True, host_budget=host_limit, configs=fixed)
    return build_timeline(model, result, budget_bytes, plan.swap_in_timing, host_limit)


def simulate_plan(profile: Profile, plan: Plan, link: Link | str | None = None,
                  budget: int | str | None = None,
                  host_budget: int | str | float | None = None) -> Plan:
    """A copy of ``plan`` with what ``simulate`` predicts filled in: schedule, iteration time,
    peaks, budgets, link, classification table and the Timeline itself; one that does not fit
    comes back with ``feasible=False`` and the simulator's reason (unless it had one)."""
    timeline = simulate(profile, plan, link, budget, host_budget)
    model = compile_profile(profile, link)
    done = dataclasses.replace(
        plan, schedule=timeline.schedule, iteration_time_s=timeline.iteration_time_s,
        peak_bytes=timeline.peak_bytes, budget_bytes=timeline.budget_bytes,
        host_peak_bytes=timeline.host_peak_bytes, host_budget_bytes=timeline.host_budget_bytes,
        link=model.link.name, timeline=timeline, feasible=timeline.feasible,
        configs=timeline.configs,
        reason=plan.reason or ("" if timeline.feasible else timeline.reason))
    done.table = plan_table(profile, done, timeline.stalls, model)
    return done


# ------------------------------------------------------------------ the engine

def run(model: SimModel, codes: np.ndarray, timing: str = "early", budget: float = math.inf,
        record: bool = False, host_budget: float = math.inf,
        configs: np.ndarray | None = None, cutoff: float = math.inf) -> RunResult:
    """One simulation of classes ``codes`` (per feature map) under ``budget`` bytes; a plan
    whose swapped maps hold more than ``host_budget`` bytes on the host is infeasible.
    ``configs``: the configuration index of each op that has them (model.configs); None
    chooses them (sim/configs.choose). Asked only whether it ends before ``cutoff``, a run
    stops (infeasible, ``cut_short``, a lower bound as time) once a bound reaches that."""
    return _Run(model, codes, timing, budget, record, configs, cutoff).walk().result(codes, host_budget)


def plain_lists(model: SimModel) -> tuple[list, ...]:
    """(so_s, si_s, rc_s, last_fwd, producer, dur) of ``model`` as lists, once a search."""
    return per_search(model, "engine_lists", lambda: tuple(
        a.tolist() for a in (model.so_s, model.si_s, model.rc_s, model.last_fwd,
                             model.producer, model.dur)))


class _Run:
    """The boundary loop of one simulation: three engines (compute, D2H, H2D) walked boundary
    by boundary, placing the schedule's actions (paper 4.3). The static actions (swap-outs
    after the producer, frees, recomputes) come from the classes; the dynamic ones (releases
    once a copy is done, swap-ins as early as the timing and memory allow) are decided here.

    State lives in plain Python lists and floats (numpy scalars are slower one at a time);
    memory follows sim/memory.py (``occupy`` inlined on ``top`` and ``level``)."""

    def __init__(self, model: SimModel, codes: np.ndarray, timing: str, budget: float,
                 record: bool, configs: np.ndarray | None = None,
                 cutoff: float = math.inf) -> None:
        self.model, self.timing, self.budget, self.cutoff = model, timing, budget, cutoff
        self.n, self.n_fwd, m = model.n, model.n_fwd, model.m
        life = lifetimes(model, codes)
        dur, peak = model.dur, None
        self.configs = configs
        if len(model.configs):
            if configs is None:
                tight, _ = static_top(model, life, minimal=True)
                configs = choose(model.configs, tight, life.extra, budget)
            self.configs = configs
            dur, peak = applied(model.configs, configs, model.dur, model.peak_inc)
        self.level, self.top = static_top(model, life, minimal=False, peak_inc=peak)
        self.dur_array, self.nbytes = dur, model.nbytes
        self.unlimited, self.vdnn = not math.isfinite(budget), timing == "vdnn"
        # the runtime's host seconds per action: compute waits while the host issues them
        self.c_so, self.c_rel, self.c_si, self.c_wait, self.c_rc, self.c_free = (
            model.act_s.get(a, 0.0)
            for a in ("swap_out", "release", "swap_in", "wait", "recompute", "free"))
        self.rec = Recorder(self.n) if record else None
        self.cut_short, self.delayed, self.overflow = False, 0, ""
        rest = compute_to_come(dur, model.rc_s, life, self.c_rc) if cutoff < math.inf else None
        # only ops over the budget here may need a forced release: the top never rises above
        # this (a release lowers it, a swap-in gives back part of what its map's release took)
        over = self.top[:self.n] > budget
        self.fast: tuple | None = None  # what the walk in C reads (sim/fastwalk.py), if any
        if fastwalk.serves(self):
            return fastwalk.prepare(self, codes, life, rest, over)
        self.over = set(np.flatnonzero(over).tolist())
        self.so_s, self.si_s, self.rc_s, self.last_fwd, self.producer, fastest = plain_lists(model)
        self.dur = fastest if peak is None else dur.tolist()
        self.first_at, self.end_at = life.first.tolist(), life.end.tolist()
        self._static_actions(codes, life)
        self.rest = None if rest is None else rest.tolist()
        self.swapped = np.flatnonzero(codes == SWAP).tolist()
        self.queue = sorted(self.swapped, key=lambda i: (self.first_at[i], i))
        self.target = swap_in_targets(model, timing, self.queue, life.first)

        self.so_done, self.si_done = [0.0] * m, [math.inf] * m
        self.released = [False] * m
        self.stall_d2h, self.stall_h2d = [0.0] * m, [0.0] * m
        self.l_out, self.l_in = set[int](), set[int]()
        self.inflight: deque[int] = deque()   # swap-outs not yet released, in copy order
        self.done_wait: list[int] = []        # copied, but a forward op still reads them
        self.wait_until = 0                   # the last forward read among them, the least
        self.t = self.d2h_free = self.h2d_free = self.forward_end = 0.0
        self.qpos = self.releases = 0         # releases: top's decreases (room() memo)
        self.sync_prev: list[int] = []        # vDNN: prefetches the next op synchronizes on
        self.blocked = (-1, -1, -1)           # (map, boundary of the blocking peak, releases)

    def _static_actions(self, codes: np.ndarray, life: Lifetimes) -> None:
        """Per boundary: swap-outs, recomputes, frees, and the swap-in waits (sources of a
        recompute first, then the op's own). Frees are listed only where something reads
        them (a recording, or a host cost per free): every map has one, and a search's
        thousands of runs would build them for nothing."""
        so_at: dict[int, list[int]] = {}
        rc_at: dict[int, list[int]] = {}
        free_at: dict[int, list[int]] = {}
        end_at, last_fwd = self.end_at, self.last_fwd
        producer, rc_point = self.producer, life.rc_point
        if self.rec or self.c_free:
            for i, c in enumerate(codes.tolist()):
                free_at.setdefault(end_at[i], []).append(i)
                if c == RECOMPUTE:
                    free_at.setdefault(last_fwd[i] + 1, []).append(i)
        for i in np.flatnonzero(codes == SWAP).tolist():
            so_at.setdefault(producer[i] + 1, []).append(i)
        for i in np.flatnonzero(codes == RECOMPUTE).tolist():
            rc_at.setdefault(int(rc_point[i]), []).append(i)
        self.so_at, self.rc_at, self.free_at = so_at, rc_at, free_at
        self.src_wait_at, self.op_wait_at = swap_waits(self.model, life)

    # ------------------------------------------------------------ one boundary
    def walk(self) -> _Run:
        """Every boundary in order: frees, swap-outs, releases, swap-ins, recomputes and
        waits, then op b itself on the compute engine."""
        if self.fast:
            fastwalk.walk(self)
            return self
        n, n_fwd, rec, dur, top = self.n, self.n_fwd, self.rec, self.dur, self.top
        free_at, so_at, c_free, vdnn = self.free_at, self.so_at, self.c_free, self.vdnn
        over = self.over
        rc_at, op_wait_at, n_queue = self.rc_at, self.op_wait_at, len(self.queue)
        # cheap tests first (oldest copy not done; next swap-in not needed, due and released)
        inflight, so_done, queue, first_at = self.inflight, self.so_done, self.queue, self.first_at
        target, released, rest, cutoff = self.target, self.released, self.rest, self.cutoff
        for b in range(n + 1):
            if b == n_fwd:
                self.forward_end = self.t
                late = swap_in_bound(self.t, queue, so_done, self.si_s, first_at, rest) \
                    if rest is not None else 0.0
                if late >= cutoff:
                    self.cut_short, self.t = True, late
                    return self
            if rec:
                rec.arrive(b, self.t)
                for i in free_at.get(b, ()):
                    rec.action(b, "free", i)
            if c_free and b in free_at:
                self.t += c_free * len(free_at[b])
            if b in so_at:
                self._swap_outs(b)
            if ((inflight and so_done[inflight[0]] <= self.t + EPS)
                    or (self.done_wait and b > self.wait_until)):
                self._release_done(b)
            if vdnn:
                self._vdnn_offload_waits(b)
            if (b in over and top[b] > self.budget
                    and not self._force_release(b, 0) and not self.overflow):
                self.overflow = self.overflow_message(1, b, -1, int(top[b]))
            sync_now = []
            if n_fwd <= b < n and self.qpos < n_queue:
                head = queue[self.qpos]
                if vdnn or first_at[head] == b or (target[head] <= b and released[head]
                                                   and not self._still_blocked(head, b)):
                    sync_now = self._swap_ins(b)
            if b in rc_at or b in op_wait_at or sync_now or self.sync_prev:   # else nothing
                self._recomputes_and_waits(b, sync_now)
            if rest is not None and self.t + rest[b] >= cutoff:
                self.cut_short, self.t = True, self.t + rest[b]
                return self
            if b < n:
                if rec:
                    rec.op(b, self.t)
                self.t += dur[b]
        if self.n_fwd >= n:
            self.forward_end = self.t
        return self

    def overflow_message(self, kind: int, b: int, i: int, top: int) -> str:
        """Why op ``b`` does not fit: ``top`` bytes (kind 1) or map ``i``'s swap-in (2)."""
        where = f"op {b} ({self.model.names[b]})"
        if kind == 1:
            return (f"{where} needs {top} bytes with every possible release done; budget "
                    f"{int(self.budget)}")
        return (f"swap-in of tensor {int(self.model.tensor[i])} before {where} does not fit "
                f"the budget {int(self.budget)}")

    def _swap_outs(self, b: int) -> None:
        for i in self.so_at.get(b, ()):
            self.t += self.c_so
            start = max(self.t, self.d2h_free)
            self.d2h_free = self.so_done[i] = start + self.so_s[i]
            self.inflight.append(i)
            if self.rec:
                self.rec.action(b, "swap_out", i)
                self.rec.transfer(i, "d2h", b, start, self.d2h_free)

    def _vdnn_offload_waits(self, b: int) -> None:
        """vDNN offload: compute waits for the copy at the end of the layer."""
        for i in [j for j in self.inflight if self.last_fwd[j] < b]:
            if not self.released[i]:
                self._wait_swap_out(i, b)

    def _swap_ins(self, b: int) -> list[int]:
        """Start the swap-ins due at backward boundary b, in first-need order: those whose
        timing target has come and that fit (a map needed right here is forced, releasing
        what it must). Returns vDNN's prefetches, which the next op synchronizes on."""
        sync_now: list[int] = []
        window_end = self._vdnn_window_end(b) if self.vdnn else self.n
        queue, first_at = self.queue, self.first_at
        while self.qpos < len(queue):   # each round starts a swap-in (qpos + 1) or breaks
            i = queue[self.qpos]
            forced = first_at[i] == b
            if not forced:
                if self.target[i] > b:
                    break
                if self.vdnn and first_at[i] > window_end:   # one prefetch per op, in window
                    break
            if not self.released[i]:
                if not forced:
                    break
                self._wait_swap_out(i, b)
            if not self._room(i, b):
                if not forced:
                    if self.timing != "early" and b == max(self.target[i], self.n_fwd):
                        self.delayed += 1
                    break
                if not self._force_release(b, self.nbytes[i]) and not self.overflow:
                    self.overflow = self.overflow_message(2, b, i, 0)
            self._swap_in(i, b)
            self.qpos += 1
            if self.vdnn and not forced:
                sync_now.append(i)
                break
        return sync_now

    def _vdnn_window_end(self, b: int) -> int:
        """vDNN prefetches only up to the backward of the previous convolution."""
        conv_bwd = self.model.conv_bwd
        pos = np.searchsorted(conv_bwd, b + 1)
        return int(conv_bwd[pos]) if pos < len(conv_bwd) else self.n

    def _recomputes_and_waits(self, b: int, sync_now: list[int]) -> None:
        """Recompute (its sources' swap-ins waited for first), then the op's own waits, then
        vDNN's synchronisation on the previous op's prefetches."""
        if b in self.rc_at:
            for i in self.src_wait_at.get(b, ()):
                self._wait_for(i, b)
            for i in self.rc_at[b]:
                start = self.t
                self.t += self.rc_s[i] + self.c_rc
                if self.rec:
                    self.rec.action(b, "recompute", i)
                    self.rec.recompute(i, b, start, self.t)
        for i in self.op_wait_at.get(b, ()):
            self._wait_for(i, b)
        for i in self.sync_prev:
            if self.first_at[i] != b:
                self._wait_for(i, b)
        self.sync_prev = sync_now

    # ------------------------------------------------------------ the engines' steps
    def _release(self, i: int, b: int) -> None:
        self.releases += 1
        self.t += self.c_rel
        self.released[i] = True
        self.top[b:self.end_at[i]] -= self.nbytes[i]       # sim/memory.occupy, inlined
        if self.rec:                                       # (only a recording reads level)
            self.level[b:self.end_at[i]] -= self.nbytes[i]
            self.rec.action(b, "release", i)

    def _release_done(self, b: int) -> None:
        """Release every finished swap-out whose map no forward op still reads."""
        inflight, so_done, last_fwd = self.inflight, self.so_done, self.last_fwd
        while inflight and so_done[inflight[0]] <= self.t + EPS:   # one map per round
            i = inflight.popleft()
            if last_fwd[i] < b:
                self._release(i, b)
            else:
                self.done_wait.append(i)
        if self.done_wait:
            keep = []
            for i in self.done_wait:
                if last_fwd[i] < b:
                    self._release(i, b)
                else:
                    keep.append(i)
            self.done_wait = keep
            self.wait_until = min((last_fwd[i] for i in keep), default=0)

    def _wait_swap_out(self, i: int, b: int) -> None:
        """Compute waits for map i's swap-out to finish, then releases whatever is done."""
        if self.so_done[i] > self.t + EPS:
            self.stall_d2h[i] += self.so_done[i] - self.t
            self.t = self.so_done[i]
        self.l_out.add(i)
        self._release_done(b)

    def _force_release(self, b: int, need: float) -> bool:
        """Release pending swap-outs in copy order until ``need`` bytes fit; stall compute.

        Bounded: each round releases map i or raises. Copy ends are non-decreasing in copy
        order when copy times are finite and >= 0, so after waiting for i every copy queued
        before it is done too and leaves ``inflight`` along with i."""
        while self.top[b] + need > self.budget:
            i = next((j for j in self.inflight if self.last_fwd[j] < b), -1)
            if i < 0:
                return False
            self._wait_swap_out(i, b)
            if not self.released[i]:
                raise ValueError(f"swap-out of tensor {int(self.model.tensor[i])} never "
                                 f"completes (copy times must be finite and >= 0; got "
                                 f"{self.so_s[i]!r} s)")
        return True

    def _still_blocked(self, i: int, b: int) -> bool:
        """Map i was blocked by a peak still ahead of b with no release since: it still is
        (swap-ins only add bytes)."""
        blocked = self.blocked
        return blocked[0] == i and blocked[1] >= b and blocked[2] == self.releases

    def _room(self, i: int, b: int) -> bool:
        """Whether map i fits from boundary b to its last use."""
        if self.unlimited:
            return True
        if self._still_blocked(i, b):
            return False
        window = self.top[b:self.end_at[i]]
        k = int(window.argmax())
        if window[k] + self.nbytes[i] <= self.budget:
            return True
        self.blocked = (i, b + k, self.releases)
        return False

    def _swap_in(self, i: int, b: int) -> None:
        self.t += self.c_si
        self.top[b:self.end_at[i]] += self.nbytes[i]       # sim/memory.occupy, inlined
        if self.rec:
            self.level[b:self.end_at[i]] += self.nbytes[i]
        start = max(self.t, self.h2d_free)
        self.h2d_free = self.si_done[i] = start + self.si_s[i]
        if self.rec:
            self.rec.action(b, "swap_in", i)
            self.rec.transfer(i, "h2d", b, start, self.h2d_free)

    def _wait_for(self, i: int, b: int) -> None:
        self.t += self.c_wait
        if self.si_done[i] > self.t + EPS:
            self.stall_h2d[i] += self.si_done[i] - self.t
            self.t = self.si_done[i]
            if b >= self.n_fwd:
                self.l_in.add(i)
        if self.rec:
            self.rec.action(b, "wait", i)

    # ------------------------------------------------------------ the outcome
    def result(self, codes: np.ndarray, host_budget: float) -> RunResult:
        """Time, feasibility (device and host budgets) and, when recorded, the trace."""
        model, budget = self.model, self.budget
        for i in self.swapped:
            if self.so_done[i] > self.forward_end + EPS:
                self.l_out.add(i)
        peak = int(self.top.max()) if len(self.top) else 0
        host = host_peak(model, codes)
        reason = "" if self.unlimited or peak <= budget else (
            self.overflow or f"peak {peak} bytes exceeds the budget {int(budget)}")
        if self.cut_short:
            reason = f"cut short: it cannot end before {self.cutoff} s"
        if not reason and host > host_budget:
            reason = (f"the swapped maps hold {host} bytes on the host at once; host budget "
                      f"{int(host_budget)} (recompute or keep some instead)")
        result = RunResult(self.t, not reason, peak, reason, self.forward_end,
                           sorted(self.l_out), sorted(self.l_in), np.array(self.stall_d2h),
                           np.array(self.stall_h2d), self.delayed, host_peak_bytes=host,
                           configs=self.configs, dur=self.dur_array, cut_short=self.cut_short)
        if self.rec:
            result.trace = self.rec.finish(self.level, self.top)
            result.trace["host"] = host_level(model, codes)
        return result

