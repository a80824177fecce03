"""PoocH's step 2 (paper 4.4.3): move swapped maps to recompute by r(X).

r(X) = recompute overhead / swap overhead of map X, the other classes fixed and the budget
ignored (sim/batch.py simulates all the variants side by side). The paper's loop: compute r
for every swapped map, drop each X with r >= 1, move the smallest r < 1 that still fits,
repeat: one round per moved map, each simulating two variants per remaining map over every
op, so cubic in depth (a 2000-layer chain: 231 rounds, 98 s).

Where that loop would cost more than EXACT_WORK (simulated boundaries, counted as
``_call_work`` does; the paper's networks stay below it and run the paper's loop exactly),
two changes cut it down:

* lazy r: after a move, r is refreshed only for the candidates that could hold the smallest
  value, in order of their last r, until the smallest refreshed r is no larger than any
  stale one. Moving a map to recompute frees link time, so the other swaps hide better and
  their r mostly grows; a stale value is then a lower bound and the choice is the paper's
  (where a stale value was too high, that map is chosen later than the paper would).
  Candidates whose refreshed r >= 1 are dropped, as in the paper.
* batches: a round may move several refreshed candidates at once (smallest r first, each
  still fitting, none a source or a reader of another: rebuilding neighbours chains their
  recomputes). The batch stands only if its budget-free time is no worse than its best
  map alone (the paper's move) and it gains HOLD of the sum of its maps' gains alone (maps
  that compete for the same link time gain far less together); otherwise that one map
  moves. A batch that stands doubles the next, one that does not quarters it.

Each round still simulates every op, so this mode stops at RECOMPUTE_WORK (the refinement
goes on from there): on a 2000-layer chain with a saturated link the moves interact, most
batches fail, and the step ends after about a quarter of the paper's moves.
"""
from __future__ import annotations

import math
import time

import numpy as np

from pooch_ext.policies.search import SearchStats
from pooch_ext.sim.batch import variant_times
from pooch_ext.sim.budgets import fits
from pooch_ext.sim.engine import EPS, run
from pooch_ext.sim.model import KEEP, RECOMPUTE, SWAP, SimModel

REFRESH = 8                 # candidates refreshed at a time after the first round, at least
REFRESH_PER_MOVE = 2        # and this many per map a batch may move
HOLD = 0.9                  # a batch stands if it gains this share of its moves' gains alone
RECOMPUTE_WORK = 200_000    # boundaries x (variants / 128 + 1) per step, see _call_work
EXACT_WORK = 1_000_000      # the paper's loop where its whole cost would stay below this


def recompute_step(model: SimModel, codes: np.ndarray, budget: int,
                   stats: SearchStats | None = None) -> tuple[np.ndarray, SearchStats]:
    """Step 2: move swapped maps to recompute by r(X), budget ignored in r."""
    started = time.perf_counter()
    stats = stats or SearchStats()
    codes = codes.copy()
    pool = [i for i in range(model.m) if codes[i] == SWAP and model.can[i, 2] and model.can[i, 0]]
    stats.simulations += 1
    ratios = _Refresher(model, run(model, codes, "early", math.inf).time_s, stats)
    # the paper's loop where it costs little: every r fresh every round, one move a round
    exact = _paper_work(model, len(pool)) <= EXACT_WORK
    batch = 1
    while pool and (exact or ratios.work < RECOMPUTE_WORK):
        stats.recompute_rounds += 1
        pool = ratios.refresh(codes, pool, len(pool) if exact else REFRESH_PER_MOVE * batch)
        moves: list[int] = []
        near: set[int] = set()      # maps a recompute of a move would read, or that read it
        trial = codes
        for i in sorted(ratios.fresh & set(pool), key=lambda j: (ratios.r[j], j)):
            if len(moves) == batch or not ratios.smallest(pool, i):
                break               # full, or a stale value may be smaller: refresh first
            if i in near:
                continue            # rebuilding neighbours chains their recomputes
            candidate = trial.copy()
            candidate[i] = RECOMPUTE
            if fits(model, candidate, budget):
                trial = candidate
                moves.append(i)
                near |= ratios.neighbours(i)
            elif not moves:
                pool.remove(i)      # does not fit even alone: dropped, as in the paper
        if not moves:
            continue
        if len(moves) > 1:
            stats.simulations += 1
            t = run(model, trial, "early", math.inf).time_s
            if ratios.batch_holds(moves, t):
                batch *= 2
            else:
                trial, moves = codes.copy(), moves[:1]
                trial[moves[0]] = RECOMPUTE
                t, batch = ratios.rebuilt[moves[0]], max(1, batch // 4)
        elif exact:
            stats.simulations += 1
            t = run(model, trial, "early", math.inf).time_s
        else:
            t = ratios.rebuilt[moves[0]]
            batch = batch * 2 if batch == 1 else batch
        codes = trial
        ratios.moved(t)
        pool = [i for i in pool if i not in moves]
    stats.seconds += time.perf_counter() - started
    return codes, stats


def _paper_work(model: SimModel, candidates: int) -> int:
    """The work (as ``_Refresher.work`` counts it) of the paper's loop if it moved every
    candidate: a full refresh per round."""
    return candidates * _call_work(model, 2 * candidates)


def _call_work(model: SimModel, variants: int) -> int:
    """A variant_times call walks every boundary once, each step on a vector of variants."""
    return model.n * (variants // 128 + 1)


class _Refresher:
    """r(X) per candidate, fresh (computed on the current classes) or stale (before the last
    move), and the budget-free time of the current classes."""

    def __init__(self, model: SimModel, current: float, stats: SearchStats) -> None:
        self.model, self.current, self.stats = model, current, stats
        self.r: dict[int, float] = {}
        self.rebuilt: dict[int, float] = {}
        self.fresh: set[int] = set()
        self.work = 0
        self.readers: dict[int, set[int]] = {}      # map -> maps whose recompute reads it
        for i, sources in enumerate(model.src_fm):
            for source in sources:
                self.readers.setdefault(source, set()).add(i)

    def neighbours(self, i: int) -> set[int]:
        """Map i, the maps its recompute reads and those whose recompute reads it."""
        return {i, *self.model.src_fm[i], *self.readers.get(i, ())}

    def smallest(self, pool: list[int], i: int) -> bool:
        """Whether fresh map i's r is no larger than any stale candidate's last one."""
        return all(self.r[j] >= self.r[i] for j in pool if j not in self.fresh)

    def moved(self, current: float) -> None:
        self.current = current
        self.fresh.clear()

    def batch_holds(self, moves: list[int], t: float) -> bool:
        """Whether moving ``moves`` together (budget-free time ``t``) is no slower than the
        best of them alone and gains HOLD of the sum of their gains alone (moves that
        compete for the same link time gain far less together)."""
        alone = sum(self.current - self.rebuilt[i] for i in moves)
        return t <= self.rebuilt[moves[0]] + EPS and self.current - t >= HOLD * alone

    def refresh(self, codes: np.ndarray, pool: list[int], width: int) -> list[int]:
        """Refresh until the smallest fresh r is no larger than every stale one (never
        computed counts as smallest), at least ``width`` at a time; returns ``pool`` less
        the maps now at r >= 1."""
        while True:
            stale = sorted((i for i in pool if i not in self.fresh),
                           key=lambda j: self.r.get(j, -math.inf))
            best = min((self.r[i] for i in pool if i in self.fresh), default=math.inf)
            if not stale or best <= self.r.get(stale[0], -math.inf):
                return pool
            chosen = [i for i in stale if i not in self.r] or stale[:max(REFRESH, width)]
            self._compute(codes, chosen)
            pool = [i for i in pool if i not in self.fresh or self.r[i] < 1.0]

    def _compute(self, codes: np.ndarray, chosen: list[int]) -> None:
        model = self.model
        times = variant_times(model, codes, [(i, c) for i in chosen for c in (KEEP, RECOMPUTE)])
        self.stats.simulations += len(times)
        self.work += _call_work(model, len(times))
        for k, i in enumerate(chosen):
            t_keep, t_rebuilt = times[2 * k], times[2 * k + 1]
            swap_overhead = self.current - t_keep
            self.r[i] = ((t_rebuilt - t_keep) / swap_overhead if swap_overhead > EPS
                         else math.inf)
            self.rebuilt[i] = float(t_rebuilt)
            self.stats.r[int(model.tensor[i])] = self.r[i]
            self.fresh.add(i)
