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
budget. Feasibility depends only on the classes (model.static_top): the dynamic choices
always have a tightest fallback, so a plan is infeasible only when its static memory is.

Host memory (model.host_level) depends only on the classes too: a swapped map holds its
bytes on the host from its swap-out to the end of the iteration. An optional host budget
(None: unlimited) bounds that peak; ``minimum_host_budget`` is the least a plan needs.
"""
from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from pooch_ext.report.classtable import plan_table
from pooch_ext.errors import BudgetTooSmallError, HostBudgetTooSmallError
from pooch_ext.links import Link
from pooch_ext.plan import Plan
from pooch_ext.profile import Profile
from pooch_ext.units import parse_bytes
from pooch_ext.sim.model import (KEEP, RECOMPUTE, SWAP, Lifetimes, SimModel, codes_of,
                                compile_profile, host_level, host_peak, lifetimes, static_top,
                                swap_waits)

EPS = 1e-12


@dataclass
class RunResult:
    """What one simulation found (cheap to make; the search uses it directly)."""

    time_s: float
    feasible: bool
    peak_bytes: int
    reason: str
    forward_end_s: float
    l_out: list[int]            # feature-map indices whose swap-out compute waited on / ran late
    l_in: list[int]             # feature-map indices whose swap-in a backward op waited on
    stall_d2h: np.ndarray       # (m,) seconds compute waited on each map's swap-out
    stall_h2d: np.ndarray       # (m,) seconds compute waited on each map's swap-in
    delayed: int                # swap-ins a fixed rule wanted earlier than memory allowed
    trace: dict | None = None   # intervals and actions (record=True)
    host_peak_bytes: int = 0    # host bytes the swapped maps hold at once (model.host_peak)


@dataclass
class Timeline:
    """A simulated iteration: time, memory, intervals per engine, stalls per tensor."""

    feasible: bool
    reason: str
    iteration_time_s: float
    forward_end_s: float
    peak_bytes: int
    budget_bytes: int
    link: str
    swap_in_timing: str
    ops: pd.DataFrame           # op, phase, name, start_s, end_s, stall_s, recompute_s
    transfers: pd.DataFrame     # tensor, direction (d2h/h2d), boundary, start_s, end_s, bytes
    recomputes: pd.DataFrame    # tensor, boundary, start_s, end_s
    memory: pd.DataFrame        # boundary, time_s, bytes, peak_bytes
    stalls: pd.DataFrame        # tensor, swap_out_stall_s, swap_in_stall_s, stall_s
    l_out: list[int] = field(default_factory=list)   # tensor ids (paper's L_O)
    l_in: list[int] = field(default_factory=list)    # tensor ids (paper's L_I)
    delayed_swap_ins: int = 0
    schedule: pd.DataFrame | None = None
    host_peak_bytes: int = 0              # host bytes swapped maps hold at once (memory.host_bytes)
    host_budget_bytes: int | None = None  # None: unlimited

    @property
    def total_stall_s(self) -> float:
        return float(self.stalls["stall_s"].sum()) if len(self.stalls) else 0.0


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
    result = run(model, codes_of(model, plan.classes), plan.swap_in_timing, budget_bytes,
                 record=True, host_budget=host_limit)
    return _timeline(model, result, budget_bytes, plan.swap_in_timing, host_limit)


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
        reason=plan.reason or ("" if timeline.feasible else timeline.reason))
    done.table = plan_table(profile, done, timeline.stalls, model)
    return done


def resolve_budget(profile: Profile, budget: int | str | None) -> int:
    """A budget in bytes (an int, or a string such as "16GiB"); None is the device capacity."""
    return int(profile.device.capacity_bytes if budget is None else parse_bytes(budget))


def require_budget(profile: Profile, budget: int | str | None, what: str = "") -> int:
    """``resolve_budget``, refusing one below ``minimum_budget`` with BudgetTooSmallError
    (``what``: who asked, for the message)."""
    budget_bytes = resolve_budget(profile, budget)
    minimum = minimum_budget(profile)
    if budget_bytes < minimum:
        raise BudgetTooSmallError(budget_bytes, minimum, what)
    return budget_bytes


def minimum_budget(profile: Profile) -> int:
    """The smallest budget any plan can run in: every map swapped (or, where it may not be,
    recomputed or kept), each present only while an op reads it."""
    model = compile_profile(profile)
    return least_peak(model, tightest_codes(model))


def budget_between(profile: Profile, fraction: float) -> int:
    """A budget ``fraction`` of the way from the smallest any plan reaches (0) to the in-core
    need (1), in whole bytes: how experiments and tests pick budgets that leave plans a
    choice."""
    return fraction_between(minimum_budget(profile), profile.incore_peak_bytes, fraction)


def fraction_between(floor: int, incore: int, fraction: float) -> int:
    """``floor + fraction * (incore - floor)`` in whole bytes: budget_between's rule, also for
    bounds that are maxima over several profiles."""
    return int(floor + fraction * (incore - floor))


def tightest_codes(model: SimModel) -> np.ndarray:
    """Swap where allowed, else recompute where allowed, else keep."""
    return np.where(model.can[:, 1], SWAP, np.where(model.can[:, 2], RECOMPUTE, KEEP))


def checkpoint_codes(model: SimModel, spacing: int) -> np.ndarray:
    """Keep every ``spacing``-th map counted from the input side, recompute the others (kept
    where they cannot be): Chen et al.'s checkpointing, which swaps nothing."""
    codes = np.full(model.m, KEEP)
    for i in range(model.m):
        if (i + 1) % spacing and model.can[i, RECOMPUTE]:
            codes[i] = RECOMPUTE
    return codes


def least_peak(model: SimModel, codes: np.ndarray) -> int:
    """The lowest peak any schedule of these classes reaches (the simulator reaches it when
    the budget demands)."""
    _, top = static_top(model, lifetimes(model, codes), minimal=True)
    return int(top.max())


def fits(model: SimModel, codes: np.ndarray, budget: int, host_budget: float = math.inf) -> bool:
    """Whether some schedule of these classes fits ``budget`` (the simulator finds it) and
    the host budget (every schedule of them holds the same host memory)."""
    return ((host_budget == math.inf or host_peak(model, codes) <= host_budget)
            and least_peak(model, codes) <= budget)


# ------------------------------------------------------------------ host memory

def resolve_host_budget(host_budget: int | str | float | None) -> float:
    """A host budget in bytes (an int, or a string such as "64GiB"; 0 allowed); None (or
    infinity) is unlimited, returned as math.inf so that comparisons need no special case."""
    if host_budget is None or host_budget == math.inf:
        return math.inf
    return parse_bytes(host_budget, allow_zero=True)


def require_host_budget(profile: Profile, budget_bytes: int,
                        host_budget: int | str | float | None, what: str = "") -> float:
    """``resolve_host_budget``, refusing one below ``minimum_host_budget`` at ``budget_bytes``
    with HostBudgetTooSmallError (computed only when a host budget is given)."""
    limit = resolve_host_budget(host_budget)
    if math.isfinite(limit):
        minimum = minimum_host_budget(profile, budget_bytes)
        if limit < minimum:
            raise HostBudgetTooSmallError(int(limit), minimum, budget_bytes, what)
    return limit


def minimum_host_budget(profile: Profile, budget: int | str | None = None) -> int:
    """The least host memory a plan within the device ``budget`` needs: the host peak of
    ``least_swap_codes`` (0 when a plan that swaps nothing fits). A budget below
    ``minimum_budget`` raises BudgetTooSmallError."""
    budget_bytes = require_budget(profile, budget)
    model = compile_profile(profile)
    return host_peak(model, least_swap_codes(model, budget_bytes))


def least_swap_codes(model: SimModel, budget: int) -> np.ndarray:
    """The classes with the fewest swapped bytes the planner knows within ``budget`` (which
    ``minimum_budget`` must allow).

    The host peak is the swapped maps' bytes, so a plan that swaps nothing is the answer
    wherever one fits: the checkpoint plan of the smallest spacing that fits (in-core
    first). Otherwise ``_unswapped`` from the tightest plan, in both tie orders, the fewer
    bytes winning. Its host peak (``minimum_host_budget``) is the refusal threshold: every
    host budget from it on has this plan, so the pooch search, which starts from it too,
    always finds a feasible plan there. It bounds the least over all 3^m classifications
    from above; on random networks small enough to enumerate it met that least in all but
    4 of 960 cases (one map more).
    """
    for spacing in range(1, model.m + 2):
        codes = checkpoint_codes(model, spacing)
        if fits(model, codes, budget):
            return codes
    tries = [_unswapped(model, budget, side) for side in (1, -1)]
    return min(tries, key=lambda codes: host_peak(model, codes))


def _unswapped(model: SimModel, budget: int, side: int) -> np.ndarray:
    """The tightest plan with its swapped maps, largest first (equal sizes: input side first
    for ``side`` 1, output side first for -1), switched to recompute or keep, whichever
    leaves the lower peak, wherever one fits ``budget``. Leaving swap only adds device
    memory, so one pass suffices: a switch that does not fit now never fits later."""
    codes = tightest_codes(model)
    order = sorted(np.flatnonzero(codes == SWAP).tolist(),
                   key=lambda j: (-int(model.nbytes[j]), side * int(model.tensor[j])))
    for i in order:
        best_peak, best = budget + 1, None
        for cls in (RECOMPUTE, KEEP):
            if model.can[i, cls]:
                trial = codes.copy()
                trial[i] = cls
                peak = least_peak(model, trial)
                if peak < best_peak:
                    best_peak, best = peak, trial
        if best is not None:
            codes = best
    return codes


# ------------------------------------------------------------------ the engine

def _swap_in_targets(model: SimModel, timing: str, order: list[int], first: np.ndarray) -> dict:
    """Earliest boundary each swap-in may start at under a fixed timing rule."""
    n_fwd = model.n_fwd
    if timing == "previous-op":
        return {i: max(int(first[i]) - 1, n_fwd) for i in order}
    if timing == "previous-conv":
        conv = model.conv_bwd
        out = {}
        for i in order:
            pos = np.searchsorted(conv, first[i]) - 1
            out[i] = int(conv[pos]) if pos >= 0 else n_fwd   # conv_bwd: backward ops only
        return out
    return {i: n_fwd for i in order}   # early, vdnn (vdnn adds its window at run time)


def run(model: SimModel, codes: np.ndarray, timing: str = "early", budget: float = math.inf,
        record: bool = False, host_budget: float = math.inf) -> RunResult:
    """One simulation of classes ``codes`` (per feature map) under ``budget`` bytes; a plan
    whose swapped maps hold more than ``host_budget`` bytes on the host is infeasible."""
    return _Run(model, codes, timing, budget, record).walk().result(codes, host_budget)


class _Run:
    """The boundary loop of one simulation: three engines (compute, D2H, H2D) walked boundary
    by boundary, placing the schedule's actions (paper 4.3). The static actions (swap-outs
    after the producer, frees, recomputes) come from the classes; the dynamic ones (releases
    once a copy is done, swap-ins as early as the timing and memory allow) are decided here.

    State lives in plain Python lists and floats: numpy scalars are several times slower one
    at a time, and the search runs this thousands of times. Memory follows sim/memory.py
    (``occupy`` inlined on ``top`` and ``level``)."""

    def __init__(self, model: SimModel, codes: np.ndarray, timing: str, budget: float,
                 record: bool) -> None:
        self.model, self.timing, self.budget = model, timing, budget
        self.n, self.n_fwd, m = model.n, model.n_fwd, model.m
        life = lifetimes(model, codes)
        self.level, self.top = static_top(model, life, minimal=False)
        self.nbytes = model.nbytes
        self.so_s, self.si_s, self.dur, self.rc_s = (
            model.so_s.tolist(), model.si_s.tolist(), model.dur.tolist(), model.rc_s.tolist())
        self.last_fwd, self.first_at = model.last_fwd.tolist(), life.first.tolist()
        self.end_at = life.end.tolist()
        self.unlimited = not math.isfinite(budget)
        self.vdnn = timing == "vdnn"
        # the runtime's host seconds per action: compute waits while the host issues them
        self.c_so, self.c_rel, self.c_si, self.c_wait, self.c_rc, self.c_free = (
            model.act_s.get(a, 0.0)
            for a in ("swap_out", "release", "swap_in", "wait", "recompute", "free"))
        self._static_actions(codes, life)
        self.swapped = [i for i in range(m) if codes[i] == SWAP]
        self.queue = sorted(self.swapped, key=lambda i: (self.first_at[i], i))
        self.target = _swap_in_targets(model, timing, self.queue, life.first)

        self.so_done = [0.0] * m
        self.si_done = [math.inf] * m
        self.released = [False] * m
        self.stall_d2h = [0.0] * m
        self.stall_h2d = [0.0] * m
        self.l_out: set[int] = set()
        self.l_in: set[int] = set()
        self.inflight: deque[int] = deque()   # swap-outs not yet released, in copy order
        self.done_wait: list[int] = []        # copied, but a forward op still reads them
        self.t = self.d2h_free = self.h2d_free = self.forward_end = 0.0
        self.qpos = 0
        self.delayed = 0
        self.overflow = ""
        self.sync_prev: list[int] = []        # vDNN: prefetches the next op synchronizes on
        self.rec = _Recorder(self.n) if record else None
        self.releases = 0                     # counts top's decreases (room() memo)
        self.blocked = (-1, -1, -1)           # (map, boundary of the blocking peak, releases)

    def _static_actions(self, codes: np.ndarray, life: Lifetimes) -> None:
        """Per boundary: swap-outs, recomputes, frees, and the swap-in waits (sources of a
        recompute first, then the op's own)."""
        self.so_at: dict[int, list[int]] = {}
        self.rc_at: dict[int, list[int]] = {}
        self.free_at: dict[int, list[int]] = {}
        for i, c in enumerate(codes.tolist()):
            self.free_at.setdefault(self.end_at[i], []).append(i)
            if c == SWAP:
                self.so_at.setdefault(int(self.model.producer[i]) + 1, []).append(i)
            elif c == RECOMPUTE:
                self.free_at.setdefault(self.last_fwd[i] + 1, []).append(i)
                self.rc_at.setdefault(int(life.rc_point[i]), []).append(i)
        self.src_wait_at, self.op_wait_at = swap_waits(self.model, life)

    # ------------------------------------------------------------ one boundary
    def walk(self) -> _Run:
        """Every boundary in order: frees, swap-outs, releases, swap-ins, recomputes and
        waits, then op b itself on the compute engine."""
        n, n_fwd, rec, dur, top = self.n, self.n_fwd, self.rec, self.dur, self.top
        free_at, so_at, c_free, vdnn = self.free_at, self.so_at, self.c_free, self.vdnn
        limited = not self.unlimited
        for b in range(n + 1):
            if b == n_fwd:
                self.forward_end = self.t
            if rec:
                rec.arrive(b, self.t)
                for i in free_at.get(b, ()):
                    rec.action(b, "free", i)
            if c_free and b in free_at:
                self.t += c_free * len(free_at[b])
            if b in so_at:
                self._swap_outs(b)
            if self.inflight or self.done_wait:
                self._release_done(b)
            if vdnn:
                self._vdnn_offload_waits(b)
            if (b < n and limited and top[b] > self.budget
                    and not self._force_release(b, 0) and not self.overflow):
                self.overflow = (f"op {b} ({self.model.names[b]}) needs {int(top[b])} "
                                 f"bytes with every possible release done; budget "
                                 f"{int(self.budget)}")
            sync_now = self._swap_ins(b) if n_fwd <= b < n else []
            self._recomputes_and_waits(b, sync_now)
            if b < n:
                if rec:
                    rec.op(b, self.t)
                self.t += dur[b]
        if self.n_fwd >= n:
            self.forward_end = self.t
        return self

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
                    self.overflow = (f"swap-in of tensor {int(self.model.tensor[i])} before op "
                                     f"{b} ({self.model.names[b]}) does not fit the budget "
                                     f"{int(self.budget)}")
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
        self.level[b:self.end_at[i]] -= self.nbytes[i]
        if self.rec:
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

    def _room(self, i: int, b: int) -> bool:
        """Whether map i fits from boundary b to its last use. A map blocked by a peak that
        is still ahead, with no release since, is still blocked (swap-ins only add bytes)."""
        if self.unlimited:
            return True
        blocked = self.blocked
        if blocked[0] == i and blocked[1] >= b and blocked[2] == self.releases:
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
        if not reason and host > host_budget:
            reason = (f"the swapped maps hold {host} bytes on the host at once; host budget "
                      f"{int(host_budget)} (recompute or keep some instead)")
        result = RunResult(self.t, not reason, peak, reason, self.forward_end,
                           sorted(self.l_out), sorted(self.l_in), np.array(self.stall_d2h),
                           np.array(self.stall_h2d), self.delayed, host_peak_bytes=host)
        if self.rec:
            result.trace = self.rec.finish(self.level, self.top)
            result.trace["host"] = host_level(model, codes)
        return result


class _Recorder:
    """Intervals and actions of one simulation, for the Timeline and the schedule."""

    def __init__(self, n: int) -> None:
        self.arrival = np.zeros(n + 1)
        self.start = np.zeros(n)
        self.actions: list[tuple[int, str, int]] = []
        self.transfers: list[tuple] = []
        self.recomputes: list[tuple] = []

    def arrive(self, b: int, t: float) -> None:
        self.arrival[b] = t

    def op(self, b: int, t: float) -> None:
        self.start[b] = t

    def action(self, b: int, kind: str, i: int) -> None:
        self.actions.append((b, kind, i))

    def transfer(self, i, direction, b, start, end) -> None:
        self.transfers.append((i, direction, b, start, end))

    def recompute(self, i, b, start, end) -> None:
        self.recomputes.append((i, b, start, end))

    def finish(self, level: np.ndarray, top: np.ndarray) -> dict:
        return {"arrival": self.arrival, "start": self.start, "actions": self.actions,
                "transfers": self.transfers, "recomputes": self.recomputes,
                "level": level.copy(), "top": top.copy()}


def _timeline(model: SimModel, r: RunResult, budget: int, timing: str,
              host_budget: float = math.inf) -> Timeline:
    tr = r.trace
    assert tr is not None, "run(..., record=True) records the trace"
    tid = model.tensor
    n = model.n
    start = tr["start"]
    end = start + model.dur
    rc = pd.DataFrame(tr["recomputes"], columns=["i", "boundary", "start_s", "end_s"])
    rc_time = np.zeros(n)
    if len(rc):
        inside = rc["boundary"].to_numpy() < n
        np.add.at(rc_time, rc["boundary"].to_numpy()[inside],
                  (rc["end_s"] - rc["start_s"]).to_numpy()[inside])
    arrival = tr["arrival"][:n]
    stall = np.maximum(0.0, start - arrival - rc_time)
    ops = pd.DataFrame({"op": np.arange(n), "phase": model.phases, "name": model.names,
                        "start_s": start, "end_s": end, "stall_s": stall, "recompute_s": rc_time})
    transfers = pd.DataFrame(tr["transfers"], columns=["i", "direction", "boundary", "start_s", "end_s"])
    transfers.insert(0, "tensor", tid[transfers.pop("i").to_numpy(np.int64)] if len(transfers)
                     else pd.Series(dtype="int64"))
    transfers["bytes"] = model.nbytes[[model.index[t] for t in transfers["tensor"]]] \
        if len(transfers) else pd.Series(dtype="int64")
    rc.insert(0, "tensor", tid[rc.pop("i").to_numpy(np.int64)] if len(rc) else pd.Series(dtype="int64"))
    times = np.r_[start, r.time_s]
    memory = pd.DataFrame({"boundary": np.arange(n + 1), "time_s": times,
                           "bytes": tr["level"], "peak_bytes": tr["top"],
                           "host_bytes": tr["host"]})
    stalls = pd.DataFrame({"tensor": tid, "swap_out_stall_s": r.stall_d2h,
                           "swap_in_stall_s": r.stall_h2d})
    stalls["stall_s"] = stalls.swap_out_stall_s + stalls.swap_in_stall_s
    schedule = _schedule_frame(model, tr["actions"])
    return Timeline(r.feasible, r.reason, r.time_s, r.forward_end_s, r.peak_bytes, budget,
                    model.link.name, timing, ops, transfers, rc, memory, stalls,
                    [int(tid[i]) for i in r.l_out], [int(tid[i]) for i in r.l_in], r.delayed,
                    schedule, r.host_peak_bytes,
                    None if math.isinf(host_budget) else int(host_budget))


def _schedule_frame(model: SimModel, actions: list[tuple[int, str, int]]) -> pd.DataFrame:
    frame = pd.DataFrame(actions, columns=["boundary", "action", "i"])
    frame["tensor"] = model.tensor[frame.pop("i").to_numpy(np.int64)] if len(frame) else []
    frame["order"] = frame.groupby("boundary").cumcount() if len(frame) else []
    frame = frame[["boundary", "order", "action", "tensor"]].astype(
        {"boundary": "int64", "order": "int64", "tensor": "int64"})
    frame["action"] = frame["action"].astype(object)
    return frame.reset_index(drop=True)


# re-exported: the schedule's own checks (the executor's tests use them too)
from pooch_ext.sim.check import schedule_memory, validate_schedule  # noqa: E402,F401
