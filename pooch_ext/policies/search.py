"""PoocH's two search steps (paper 4.4, DESIGN.md "The PoocH algorithm"), shared by policies.

Step 1, keep / swap (4.4.2): simulate all-swap under the budget; maps outside L_O (swap-out
waited on, or finishing after forward) and L_I (swap-in waited on) stay swap. L_I is searched
as a binary tree (keep / swap per map; when L_I is long, its ``max_depth`` costliest maps, the
others join the greedy walk) with two prunings: a set of keeps that does not fit
has no fitting superset (memory is monotone in the keep set), and branch-and-bound on a lower
bound (the budget-free time with every undecided map kept: keeping never slows the budget-free
timeline, and a budget only delays it). At each leaf L_O \\ L_I is walked from the output side,
switching swap to keep wherever it fits; the leaf is simulated under the budget; the fastest
feasible leaf wins.

Step 2, recompute (4.4.3): r(X) = recompute overhead / swap overhead with the other classes
fixed and the budget ignored; drop every X with r >= 1, move the smallest r < 1 that still
fits to recompute, repeat.

A host budget (``host_budget``, math.inf: none) is a constraint of every budgeted
simulation: a plan whose swapped maps exceed it counts as infeasible, so the searches keep
the fastest plan that meets both budgets. Moves from swap to keep or recompute only lower
host memory; they are checked against the device budget alone.
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np

from pooch_ext.sim.batch import variant_times
from pooch_ext.sim.memory import occupy
from pooch_ext.sim.model import KEEP, RECOMPUTE, SWAP, SimModel, lifetimes, static_top
from pooch_ext.sim.budgets import fits, tightest_codes
from pooch_ext.sim.engine import EPS, run


@dataclass
class SearchStats:
    """How much work a search did (printed by the benchmarks)."""

    l_out: int = 0
    l_in: int = 0
    nodes: int = 0
    leaves: int = 0
    pruned_memory: int = 0
    pruned_bound: int = 0
    truncated: bool = False
    simulations: int = 0
    recompute_rounds: int = 0
    r: dict[int, float] = field(default_factory=dict)   # tensor id -> last r(X) computed
    refine_simulations: int = 0
    seed_times: dict[str, float] = field(default_factory=dict)   # budgeted time of each seed
    seed: str = ""              # the seed whose refinement won
    seconds: float = 0.0


class _Evaluator:
    """Simulations with memoization; counts them. ``budgeted=False`` drops both budgets."""

    def __init__(self, model: SimModel, budget: int, stats: SearchStats,
                 host_budget: float = math.inf) -> None:
        self.model, self.budget, self.stats = model, budget, stats
        self.host_budget = host_budget
        self._cache: dict[tuple[bytes, bool], object] = {}

    def run(self, codes: np.ndarray, budgeted: bool = True):
        key = (codes.tobytes(), budgeted)
        hit = self._cache.get(key)
        if hit is None:
            self.stats.simulations += 1
            hit = (run(self.model, codes, "early", self.budget, host_budget=self.host_budget)
                   if budgeted else run(self.model, codes, "early", math.inf))
            self._cache[key] = hit
        return hit

    def time(self, codes: np.ndarray, budgeted: bool = True) -> float:
        result = self.run(codes, budgeted)
        return result.time_s if result.feasible else math.inf


class _KeepRoom:
    """Tightest static memory of a keep/swap classification, updated one keep at a time.

    Switching a swapped map to keep fills its hole (after its last forward use, before its
    first backward need); it fits if the hole's highest point has room for it.
    """

    def __init__(self, model: SimModel, codes: np.ndarray, budget: int) -> None:
        life = lifetimes(model, codes)
        _, self.top = static_top(model, life, minimal=True)
        self.lo = model.last_fwd + 1
        self.hi = life.first
        self.nbytes = model.nbytes
        self.budget = budget

    def fits_keep(self, top: np.ndarray, i: int) -> bool:
        a, z = self.lo[i], self.hi[i]
        return a >= z or top[a:z].max() + self.nbytes[i] <= self.budget

    def keep(self, top: np.ndarray, i: int) -> np.ndarray:
        out = top.copy()
        occupy(out, self.lo[i], self.hi[i], self.nbytes[i])
        return out


def keep_swap(model: SimModel, budget: int, max_depth: int = 8,
              stats: SearchStats | None = None,
              host_budget: float = math.inf) -> tuple[np.ndarray, SearchStats]:
    """Step 1: the keep / swap classification, starting from all-swap
    (sim.budgets.tightest_codes: where a map may not be swapped, recompute or keep)."""
    started = time.perf_counter()
    stats = stats or SearchStats()
    ev = _Evaluator(model, budget, stats, host_budget)
    base = tightest_codes(model)
    first = ev.run(base)
    swappable = {i for i in range(model.m) if base[i] == SWAP and model.can[i, 0]}
    l_in = [i for i in first.l_in if i in swappable]
    l_out = [i for i in first.l_out if i in swappable]
    stats.l_out, stats.l_in = len(l_out), len(l_in)
    # the tree decides the most costly swap-ins (at most max_depth of them); the rest of L_I
    # joins L_O \ L_I in the greedy walk from the output side
    l_in.sort(key=lambda i: -(first.stall_h2d[i] + first.stall_d2h[i]))
    stats.truncated = len(l_in) > max_depth
    l_in, spill = l_in[:max_depth], l_in[max_depth:]
    rest = sorted((set(l_out) - set(l_in)) | set(spill), key=lambda i: -model.tensor[i])
    room = _KeepRoom(model, base, budget)
    best_time = ev.time(base)
    best = base.copy()

    def bound(codes: np.ndarray, depth: int) -> float:
        trial = codes.copy()
        trial[l_in[depth:]] = KEEP
        trial[rest] = KEEP
        return ev.time(trial, budgeted=False)

    def leaf(codes: np.ndarray, top: np.ndarray) -> None:
        nonlocal best_time, best
        stats.leaves += 1
        codes = codes.copy()
        for i in rest:
            if room.fits_keep(top, i):
                top = room.keep(top, i)
                codes[i] = KEEP
        t = ev.time(codes)
        if t < best_time - EPS:
            best_time, best = t, codes

    def dfs(codes: np.ndarray, top: np.ndarray, depth: int) -> None:
        stats.nodes += 1
        if depth == len(l_in):
            leaf(codes, top)
            return
        if bound(codes, depth) >= best_time - EPS:
            stats.pruned_bound += 1
            return
        i = l_in[depth]
        if room.fits_keep(top, i):
            kept = codes.copy()
            kept[i] = KEEP
            dfs(kept, room.keep(top, i), depth + 1)
        else:
            stats.pruned_memory += 1
        dfs(codes, top, depth + 1)

    dfs(base, room.top, 0)
    stats.seconds += time.perf_counter() - started
    return best, stats


def recompute_step(model: SimModel, codes: np.ndarray, budget: int,
                   stats: SearchStats | None = None) -> tuple[np.ndarray, SearchStats]:
    """Step 2: move swapped maps to recompute by r(X) (paper 4.4.3), budget ignored in r."""
    started = time.perf_counter()
    stats = stats or SearchStats()
    codes = codes.copy()
    pool = [i for i in range(model.m) if codes[i] == SWAP and model.can[i, 2] and model.can[i, 0]]
    while pool:
        stats.recompute_rounds += 1
        current = run(model, codes, "early", math.inf).time_s
        times = variant_times(model, codes, [(i, c) for i in pool for c in (KEEP, RECOMPUTE)])
        stats.simulations += 1 + len(times)
        ratios = {}
        for k, i in enumerate(pool):
            t_keep, t_rebuilt = times[2 * k], times[2 * k + 1]
            swap_overhead = current - t_keep
            ratios[i] = ((t_rebuilt - t_keep) / swap_overhead if swap_overhead > EPS
                         else math.inf)
            stats.r[int(model.tensor[i])] = ratios[i]
        pool = [i for i in pool if ratios[i] < 1.0]
        moved = False
        for i in sorted(pool, key=lambda j: ratios[j]):
            pool.remove(i)
            trial = codes.copy()
            trial[i] = RECOMPUTE
            if fits(model, trial, budget):
                codes = trial
                moved = True
                break
        if not moved:
            break
    stats.seconds += time.perf_counter() - started
    return codes, stats


# the refinement's work limit: simulated op boundaries (simulations x ops), so the time it
# takes is about the same whatever the depth; deep networks still get MIN_REFINE_SIMULATIONS
REFINE_WORK = 1_000_000
MIN_REFINE_SIMULATIONS = 400


def refine_budget(model: SimModel) -> int:
    """How many simulations the refinement may spend on ``model`` (about a second or two)."""
    return max(MIN_REFINE_SIMULATIONS, REFINE_WORK // max(1, model.n))


def refine(model: SimModel, codes: np.ndarray, budget: int, max_simulations: int | None = None,
           stats: SearchStats | None = None, evaluator: _Evaluator | None = None,
           host_budget: float = math.inf) -> tuple[np.ndarray, SearchStats]:
    """Step 3 (ours, not the paper's): local search on the budgeted time.

    The two paper steps decide keep before recompute exists, so memory can end up holding
    maps that are cheap to rebuild while expensive ones are swapped. Moves: switch a swapped
    map to recompute or a recomputed one to swap; demote a kept map (to recompute or swap)
    and refill the memory it frees with other maps, output side first, wherever they fit;
    change every map of a group at once: coordinated moves no single change reaches, such as
    keeping one map and rebuilding another instead. The groups widen in phases, each run
    until it finds nothing: neighbouring pairs, then neighbouring triples, then, where a
    round of them costs no more than the simulation limit (small networks), any two maps.
    First improvement, and the scan goes on after the improving move instead of starting
    over, so simulations go to moves not yet tried since the last change. Ends when the
    widest phase finds nothing or ``max_simulations`` (default ``refine_budget``) new
    simulations are spent. A given ``evaluator`` brings its own host budget.
    """
    started = time.perf_counter()
    stats = stats or SearchStats()
    ev = evaluator or _Evaluator(model, budget, stats, host_budget)
    limit = refine_budget(model) if max_simulations is None else max_simulations
    first_simulation = ev.stats.simulations
    best_time = ev.time(codes)
    floor = in_core_time(model)
    phases: list[list[tuple[int, ...]] | None] = [_windows(model, 2),
                                                  _windows(model, 2) + _windows(model, 3)]
    if 9 * model.m * (model.m - 1) // 2 <= limit:
        phases.append(None)      # any two maps, built only if reached
    for groups in phases:
        if best_time <= floor or ev.stats.simulations - first_simulation >= limit:
            break
        if groups is None:
            groups = [(i, j) for i in range(model.m) for j in range(i + 1, model.m)]
            groups += _windows(model, 3)
        slots = _moves(model, groups)
        pos = since = 0
        while since < len(slots) and best_time > floor:
            if ev.stats.simulations - first_simulation >= limit:
                break
            trial = _apply(model, codes, slots[pos], budget)
            pos, since = (pos + 1) % len(slots), since + 1
            if trial is None or not fits(model, trial, budget, ev.host_budget):
                continue
            t = ev.time(trial)
            if t < best_time * (1 - 1e-9):
                codes, best_time, since = trial, t, 0
    stats.refine_simulations += ev.stats.simulations - first_simulation
    stats.seconds += time.perf_counter() - started
    return codes, stats


def in_core_time(model: SimModel) -> float:
    """Every op back to back (with rounding slack): no plan can be faster."""
    return float(model.dur.sum()) * (1 + 1e-12)


def _windows(model: SimModel, width: int) -> list[tuple[int, ...]]:
    """Every run of ``width`` neighbouring maps (in tensor order)."""
    return [tuple(range(lo, lo + width)) for lo in range(model.m - width + 1)]


def _moves(model: SimModel, groups: list[tuple[int, ...]]) -> list[tuple]:
    """Every move of the refinement in scan order; whether one applies depends on the classes.

    ("flip", i): swap <-> recompute; ("demote", i, c): a kept map to class c, then refill
    (cheapest rebuilds first); ("group", maps, combo): each of ``maps`` takes its class in
    ``combo`` (applies only where every one of them changes).
    """
    slots: list[tuple] = [("flip", int(i)) for i in np.argsort(-model.tensor)]
    cheapest = sorted(range(model.m),
                      key=lambda j: model.rc_s[j] if model.can[j, RECOMPUTE] else math.inf)
    slots += [("demote", i, c) for i in cheapest for c in (RECOMPUTE, SWAP)]
    combos = {}
    for group in groups:
        width = len(group)
        if width not in combos:
            combos[width] = list(itertools.product((KEEP, SWAP, RECOMPUTE), repeat=width))
        slots += [("group", group, combo) for combo in combos[width]]
    return slots


def _apply(model: SimModel, codes: np.ndarray, move: tuple, budget: int) -> np.ndarray | None:
    """The classes after ``move``, or None where it does not apply to ``codes``."""
    kind = move[0]
    if kind == "flip":
        i = move[1]
        new = {SWAP: RECOMPUTE, RECOMPUTE: SWAP}.get(int(codes[i]))
        if new is None or not model.can[i, new]:
            return None
        trial = codes.copy()
        trial[i] = new
        return trial
    if kind == "demote":
        i, new = move[1], move[2]
        if codes[i] != KEEP or not model.can[i, new]:
            return None
        trial = codes.copy()
        trial[i] = new
        return _refill(model, trial, budget, exclude={i})
    group, combo = move[1], move[2]
    if any(codes[j] == c or not model.can[j, c] for j, c in zip(group, combo)):
        return None
    trial = codes.copy()
    trial[list(group)] = combo
    return trial


def multi_start(model: SimModel, seeds: dict[str, np.ndarray | None], budget: int,
                max_simulations: int | None = None, stats: SearchStats | None = None,
                host_budget: float = math.inf) -> tuple[np.ndarray, SearchStats]:
    """Refine several starting plans; the fastest result wins.

    A local search ends in the local optimum of the basin it starts in, and which basin the
    paper's steps land in depends on the link: on slow links they start from all-swap and
    keep maps whose swaps nothing can hide, far from a good plan. Seeds from other regions
    (a recompute-only checkpoint plan, whose time does not depend on the link at all) give
    starting points a slower link does not spoil. The simulations are shared out in two
    rounds: every seed (fastest first) gets a short refinement of ``limit / (2 x seeds)``,
    then the best result so far gets all that is left. A seed's own time says little about
    its basin (the checkpoint plan often starts fastest and ends slowest), a short
    refinement says much more.
    """
    stats = stats or SearchStats()
    ev = _Evaluator(model, budget, stats, host_budget)
    limit = refine_budget(model) if max_simulations is None else max_simulations
    ready = {name: codes for name, codes in seeds.items() if codes is not None}
    stats.seed_times = {name: ev.time(codes) for name, codes in ready.items()}
    spent = stats.refine_simulations
    share = limit // (2 * max(1, len(ready)))
    best, best_time = None, math.inf
    for name in sorted(ready, key=lambda k: stats.seed_times[k]):
        codes, _ = refine(model, ready[name], budget, share, stats, ev)
        t = ev.time(codes)
        if best is None or t < best_time:
            best, best_time, stats.seed = codes, t, name
        if best_time <= in_core_time(model):
            return best, stats
    left = limit - (stats.refine_simulations - spent)
    if best is not None and left > 0:
        best, _ = refine(model, best, budget, left, stats, ev)
    if best is None:
        raise ValueError("multi_start needs at least one seed that is not None")
    return best, stats


def _refill(model: SimModel, codes: np.ndarray, budget: int, exclude: set[int]) -> np.ndarray:
    """Switch non-kept maps to keep, output side first, wherever the memory allows."""
    room = _KeepRoom(model, codes, budget)
    top = room.top
    codes = codes.copy()
    for i in np.argsort(-model.tensor):
        if codes[i] != KEEP and i not in exclude and model.can[i, 0] and room.fits_keep(top, i):
            top = room.keep(top, i)
            codes[i] = KEEP
    return codes


def fill_keeps(model: SimModel, codes: np.ndarray, budget: int,
               stats: SearchStats | None = None,
               host_budget: float = math.inf) -> tuple[np.ndarray, SearchStats]:
    """Spend memory the plan leaves free: switch maps to keep, output side first, wherever it
    fits and the predicted iteration is no slower (fewer transfers and rebuilds to go wrong
    when the real link or ops are slower than profiled)."""
    started = time.perf_counter()
    stats = stats or SearchStats()
    ev = _Evaluator(model, budget, stats, host_budget)
    current = ev.time(codes)
    for i in np.argsort(-model.tensor):
        if codes[i] == KEEP or not model.can[i, KEEP]:
            continue
        trial = codes.copy()
        trial[i] = KEEP
        if fits(model, trial, budget):
            t = ev.time(trial)
            if t <= current * (1 + 1e-12):
                codes, current = trial, t
    stats.seconds += time.perf_counter() - started
    return codes, stats
