"""PoocH's step 1, keep / swap (paper 4.4.2, DESIGN.md "The PoocH algorithm"), and what
every search step shares: its counters and a memoizing evaluator. Step 2 is
policies/recompute.py, our refinement policies/refine.py.

Step 1, keep / swap (4.4.2): simulate all-swap under the budget; maps outside L_O (swap-out
waited on, or finishing after forward) and L_I (swap-in waited on) stay swap. L_I is searched
as a binary tree (keep / swap per map; when L_I is long, its ``max_depth`` costliest maps, the
others join the greedy walk; ``tree_depth``: 8, less on deep networks, whose simulations
cost more) with two prunings: a set of keeps that does not fit has no fitting superset
(memory is monotone in the keep set), and branch-and-bound on a lower bound (the
budget-free time with every undecided map kept: keeping never slows the budget-free
timeline, and a budget only delays it). At each leaf L_O \\ L_I is walked from the output
side, switching swap to keep wherever it fits; the leaf is simulated under the budget; the
fastest feasible leaf wins.

A host budget (``host_budget``, math.inf: none) is a constraint of every budgeted
simulation: a plan whose swapped maps exceed it counts as infeasible, so the searches keep
the fastest plan that meets both budgets. Moves from swap to keep or recompute only lower
host memory; they are checked against the device budget alone.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from pooch_ext.sim.clib import for_model
from pooch_ext.sim.memory import occupy
from pooch_ext.sim.lifetimes import lifetimes, static_top
from pooch_ext.sim.model import KEEP, SWAP, SimModel
from pooch_ext.sim.budgets import tightest_codes
from pooch_ext.sim.engine import EPS, run
from pooch_ext.sim.timeline import RunResult


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
    refine_pruned: int = 0      # refinement trials skipped: their compute floor cannot win
    resimulated: int = 0        # simulations cut short, then needed in full (uncounted)
    seed_times: dict[str, float] = field(default_factory=dict)   # budgeted time of each seed
    seed: str = ""              # the seed whose refinement won
    seconds: float = 0.0


class Evaluator:
    """Simulations with memoization; counts them. ``budgeted=False`` drops both budgets.

    ``cutoff``: the caller only needs to know whether the plan ends before it (the
    refinement's trials, the keep / swap tree, fill_keeps); the simulation stops once it
    cannot (engine.run). Such a result is kept as a
    lower bound: a later question it cannot answer simulates again, uncounted, so a search
    takes the same path and counts the same simulations with cutoffs as without."""

    def __init__(self, model: SimModel, budget: int, stats: SearchStats,
                 host_budget: float = math.inf) -> None:
        self.model, self.budget, self.stats = model, budget, stats
        self.host_budget = host_budget
        self._cache: dict[tuple[bytes, bool], RunResult] = {}

    def run(self, codes: np.ndarray, budgeted: bool = True,
            cutoff: float = math.inf) -> RunResult:
        key = (codes.tobytes(), budgeted)
        hit = self._cache.get(key)
        if hit is not None and not (hit.cut_short and hit.time_s < cutoff):
            return hit
        if hit is None:
            self.stats.simulations += 1
        else:
            self.stats.resimulated += 1
        hit = (run(self.model, codes, "early", self.budget, host_budget=self.host_budget,
                   cutoff=cutoff)
               if budgeted else run(self.model, codes, "early", math.inf, cutoff=cutoff))
        self._cache[key] = hit
        return hit

    def time(self, codes: np.ndarray, budgeted: bool = True, cutoff: float = math.inf) -> float:
        """The plan's time (infinite where it does not fit); with ``cutoff``, any time at or
        above it may come back as infinite."""
        result = self.run(codes, budgeted, cutoff)
        return result.time_s if result.feasible else math.inf


class KeepRoom:
    """Tightest static memory of a keep/swap classification, updated one keep at a time.

    Switching a swapped map to keep fills its hole (after its last forward use, before its
    first backward need); it fits if the hole's highest point has room for it.
    """

    def __init__(self, model: SimModel, codes: np.ndarray, budget: int) -> None:
        life = lifetimes(model, codes)
        _, self.top = static_top(model, life, minimal=True)
        self.model = model
        self.lo = model.last_fwd + 1
        self.hi = life.first
        self.nbytes = model.nbytes
        self.budget = budget
        # what walk.c's fill reads, made when first asked: lo, hi and nbytes contiguous, and
        # their addresses
        self._c: tuple[list[np.ndarray], list[int]] | None = None

    def fits_keep(self, top: np.ndarray, i: int) -> bool:
        a, z = self.lo[i], self.hi[i]
        return a >= z or top[a:z].max() + self.nbytes[i] <= self.budget

    def keep(self, top: np.ndarray, i: int) -> np.ndarray:
        out = top.copy()
        occupy(out, self.lo[i], self.hi[i], self.nbytes[i])
        return out

    def fill(self, top: np.ndarray, candidates: list[int]) -> list[int]:
        """The candidates (in the order given) that fit one after another from ``top``: in
        walk.c where it loads (sim/clib.py), else in NumPy (``_fill_numpy``)."""
        lib, budget = for_model(self.model), self.budget
        # (walk.c takes the budget in int64, not an unlimited one)
        if lib is None or not candidates or not isinstance(budget, (int, np.integer)) \
                or budget >= 2**62:
            return self._fill_numpy(top, candidates)
        if self._c is None:
            arrays = [np.ascontiguousarray(a, np.int64) for a in (self.lo, self.hi, self.nbytes)]
            self._c = arrays, [a.ctypes.data for a in arrays]
        order = np.asarray(candidates, np.int64)
        work = np.empty(len(top) + len(order), np.int64)    # top, then the maps kept
        work[:len(top)] = top
        at = work.ctypes.data
        count = lib.fill(len(order), order.ctypes.data, *self._c[1], int(budget), at,
                         at + 8 * len(top))
        return work[len(top):len(top) + count].tolist()

    def _fill_numpy(self, top: np.ndarray, candidates: list[int]) -> list[int]:
        """Keeping only raises ``top``, so a candidate that does not fit at the start never
        will: one vectorized test (the highest point of every hole at once) rules those out,
        and only the rest are walked one by one (most candidates of a full memory fail)."""
        if not candidates:
            return []
        order = np.asarray(candidates)
        lo, hi = self.lo[order], self.hi[order]
        open_ = lo < hi
        could = ~open_          # an empty hole always fits
        if open_.any():
            # maximum over [lo, hi) of every open hole: reduceat over the interleaved edges
            # (hi <= n < len(top)); the odd slots ([hi, next lo)) are not used
            edges = np.column_stack((lo[open_], hi[open_])).ravel()
            highest = np.maximum.reduceat(top, edges)[::2]
            could[open_] = highest + self.nbytes[order[open_]] <= self.budget
        kept: list[int] = []
        for i in order[could].tolist():
            if not kept or self.fits_keep(top, i):
                top = self.keep(top, i)
                kept.append(i)
        return kept


def keep_candidates(model: SimModel, codes: np.ndarray) -> list[int]:
    """The maps not kept that may be, output side first (the order every keep walk takes)."""
    order = np.arange(model.m - 1, -1, -1)     # model.tensor ascends: output side first
    return order[(codes[order] != KEEP) & model.can[order, KEEP]].tolist()


# the tree's limit, in units of simulation_cost: a tree of depth d simulates up to about
# 3 x 2^d plans, so deep networks get a shallower tree; the paper's networks keep depth 8
KEEP_SWAP_WORK = 1_000_000
MAX_TREE_DEPTH = 8
# up to this many boundaries a simulation costs about the same per boundary (the paper's
# networks: ResNet-50 353, ResNeXt-101 3D 693); beyond, the memory updates at swaps and
# releases (slices of every later boundary) make it grow faster
SHALLOW = 700


def simulation_cost(model: SimModel) -> float:
    """What one simulation of ``model`` costs, in boundaries: n up to SHALLOW, n^2 / SHALLOW
    beyond (measured per boundary: 3 us at 353 boundaries, 7 us at 4000; the extra factor
    also keeps a 2000-layer network's search within seconds)."""
    return model.n * max(1.0, model.n / SHALLOW)


def tree_depth(model: SimModel) -> int:
    """The keep / swap tree's depth on ``model``: MAX_TREE_DEPTH within KEEP_SWAP_WORK."""
    fit = int(math.log2(max(2.0, KEEP_SWAP_WORK / (3 * simulation_cost(model)))))
    return max(1, min(MAX_TREE_DEPTH, fit))


def keep_swap(model: SimModel, budget: int, max_depth: int | None = None,
              stats: SearchStats | None = None,
              host_budget: float = math.inf) -> tuple[np.ndarray, SearchStats]:
    """Step 1: the keep / swap classification, starting from all-swap
    (sim.budgets.tightest_codes: where a map may not be swapped, recompute or keep)."""
    started = time.perf_counter()
    stats = stats or SearchStats()
    max_depth = tree_depth(model) if max_depth is None else max_depth
    ev = Evaluator(model, budget, stats, host_budget)
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
    room = KeepRoom(model, base, budget)
    best_time = ev.time(base)
    best = base.copy()

    def bound(codes: np.ndarray, depth: int) -> float:
        trial = codes.copy()
        trial[l_in[depth:]] = KEEP
        trial[rest] = KEEP
        return ev.time(trial, budgeted=False, cutoff=best_time - EPS)

    def leaf(codes: np.ndarray, top: np.ndarray) -> None:
        nonlocal best_time, best
        stats.leaves += 1
        codes = codes.copy()
        codes[room.fill(top, rest)] = KEEP
        t = ev.time(codes, cutoff=best_time - EPS)
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
