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
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np

from pooch_ext.batchsim import variant_times
from pooch_ext.simmodel import KEEP, RECOMPUTE, SWAP, SimModel, lifetimes, static_top
from pooch_ext.simulator import fits, run

EPS = 1e-12


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
    seconds: float = 0.0


class _Evaluator:
    """Simulations with memoization; counts them."""

    def __init__(self, model: SimModel, budget: int, stats: SearchStats) -> None:
        self.model, self.budget, self.stats = model, budget, stats
        self._cache: dict[tuple[bytes, bool], object] = {}

    def run(self, codes: np.ndarray, budgeted: bool = True):
        key = (codes.tobytes(), budgeted)
        hit = self._cache.get(key)
        if hit is None:
            self.stats.simulations += 1
            hit = run(self.model, codes, "early", self.budget if budgeted else math.inf)
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
        out[self.lo[i]:self.hi[i]] += self.nbytes[i]
        return out


def keep_swap(model: SimModel, budget: int, max_depth: int = 8,
              stats: SearchStats | None = None) -> tuple[np.ndarray, SearchStats]:
    """Step 1: the keep / swap classification (swap where a map may not be kept or swapped
    follows simulator.tightest_codes)."""
    started = time.perf_counter()
    stats = stats or SearchStats()
    ev = _Evaluator(model, budget, stats)
    base = np.where(model.can[:, 1], SWAP, np.where(model.can[:, 2], RECOMPUTE, KEEP))
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


def refine(model: SimModel, codes: np.ndarray, budget: int, max_simulations: int = 400,
           stats: SearchStats | None = None) -> tuple[np.ndarray, SearchStats]:
    """Step 3 (ours, not the paper's): local search on the budgeted time.

    The two paper steps decide keep before recompute exists, so memory can end up holding
    maps that are cheap to rebuild while expensive ones are swapped. Moves, first
    improvement, until none improves or ``max_simulations`` are spent: switch a swapped map
    to recompute or a recomputed one to swap; demote a kept map (to recompute or swap) and
    refill the memory it frees with other maps, output side first, wherever they fit.
    """
    started = time.perf_counter()
    stats = stats or SearchStats()
    ev = _Evaluator(model, budget, stats)
    best_time = ev.time(codes)
    budget_left = max_simulations
    if best_time <= model.dur.sum() * (1 + 1e-12):   # already at the in-core time
        return codes, stats

    def moves(codes: np.ndarray):
        for i in np.argsort(-model.tensor):
            c = codes[i]
            if c == SWAP and model.can[i, 2]:
                yield [(i, RECOMPUTE)], False
            elif c == RECOMPUTE and model.can[i, 1]:
                yield [(i, SWAP)], False
        kept = [i for i in range(model.m) if codes[i] == KEEP]
        for i in sorted(kept, key=lambda j: model.rc_s[j] if model.can[j, 2] else math.inf):
            for c in (RECOMPUTE, SWAP):
                if model.can[i, c]:
                    yield [(i, c)], True
        # several neighbouring maps at once (pairs, then triples): coordinated moves no
        # single change reaches, e.g. recompute one map and swap its source instead
        for width in (2, 3):
            for lo in range(model.m - width + 1):
                window = range(lo, lo + width)
                options = [[c for c in range(3) if model.can[i, c]] for i in window]
                for combo in itertools.product(*options):
                    if all(c != codes[i] for i, c in zip(window, combo)):
                        yield list(zip(window, combo)), False

    improved = True
    while improved and budget_left > 0:
        improved = False
        for change, refill in moves(codes):
            trial = codes.copy()
            for i, c in change:
                trial[i] = c
            if refill:
                trial = _refill(model, trial, budget, exclude={i for i, _ in change})
            if not fits(model, trial, budget):
                continue
            budget_left -= 1
            t = ev.time(trial)
            if t < best_time * (1 - 1e-9):
                codes, best_time, improved = trial, t, True
                break
            if budget_left <= 0:
                break
    stats.seconds += time.perf_counter() - started
    return codes, stats


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
               stats: SearchStats | None = None) -> tuple[np.ndarray, SearchStats]:
    """Spend memory the plan leaves free: switch maps to keep, output side first, wherever it
    fits and the predicted iteration is no slower (fewer transfers and rebuilds to go wrong
    when the real link or ops are slower than profiled)."""
    started = time.perf_counter()
    stats = stats or SearchStats()
    ev = _Evaluator(model, budget, stats)
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
