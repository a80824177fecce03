"""Exact reference: the best classification of a small network, by branch and bound.

The optimum is taken against the same simulator the policies use (same memory rule, same
early swap-in scheduling), so the gap of a heuristic to it measures the heuristic alone, not
a difference of models. The search enumerates every classification implicitly and prunes
only with bounds that hold for every completion:

* memory: swap is the tightest class for a map's own presence and changes no other map's
  lifetime, so if a partial classification does not fit with every undecided map swapped,
  no completion fits (sim.budgets.fits decides fitting exactly);
* time: a budget only delays a timeline, and without a budget switching a map from swap to
  keep never delays anything (its copies leave the queues, nothing else changes), so with
  the recompute set fixed the budget-free time with every undecided map kept bounds every
  keep/swap completion from below.

Hence the two levels: an outer enumeration of recompute sets, an inner keep/swap tree.
``brute_force`` enumerates all 3^n classifications (the tests check both agree).
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

import numpy as np

from pooch_ext.sim.model import KEEP, NAME, RECOMPUTE, SWAP, SimModel
from pooch_ext.sim.budgets import fits, tightest_codes
from pooch_ext.sim.engine import run

MAX_MAPS = 16


@dataclass
class ExactResult:
    codes: np.ndarray
    time_s: float
    simulations: int
    seconds: float

    def classes(self, model: SimModel) -> dict[int, str]:
        return {int(t): NAME[int(c)] for t, c in zip(model.tensor, self.codes)}


def exact_best(model: SimModel, budget: int, timing: str = "early") -> ExactResult:
    """The fastest feasible classification of every feature map under ``budget``."""
    if model.m > MAX_MAPS:
        raise ValueError(f"exact search is for at most {MAX_MAPS} feature maps, "
                         f"this network has {model.m}")
    started = time.perf_counter()
    m = model.m
    sims = 0
    best_time, best = math.inf, None
    order = list(np.argsort(-model.tensor))   # output side first: small holes, fast incumbents

    def timed(codes: np.ndarray, budgeted: bool) -> float:
        nonlocal sims
        sims += 1
        result = run(model, codes, timing, budget if budgeted else math.inf)
        return result.time_s if result.feasible else math.inf

    def inner(codes: np.ndarray, undecided: list[int]) -> None:
        """Keep / swap for ``undecided`` (codes hold their tightest class meanwhile)."""
        nonlocal best_time, best
        if not fits(model, codes, budget):
            return
        optimistic = codes.copy()
        optimistic[[i for i in undecided if model.can[i, KEEP]]] = KEEP
        if undecided and timed(optimistic, False) >= best_time:
            return
        if not undecided:
            t = timed(codes, True)
            if t < best_time:
                best_time, best = t, codes.copy()
            return
        i, rest = undecided[0], undecided[1:]
        for c in (KEEP, SWAP):
            if model.can[i, c]:
                trial = codes.copy()
                trial[i] = c
                inner(trial, rest)
        if not model.can[i, KEEP] and not model.can[i, SWAP]:
            inner(codes, rest)

    def outer(codes: np.ndarray, k: int) -> None:
        """Choose the recompute set map by map; the rest go to the inner tree."""
        if not fits(model, codes, budget):
            return
        if k == m:
            inner(codes, [i for i in order if codes[i] != RECOMPUTE])
            return
        i = order[k]
        if model.can[i, RECOMPUTE]:
            trial = codes.copy()
            trial[i] = RECOMPUTE
            outer(trial, k + 1)
        if model.can[i, KEEP] or model.can[i, SWAP]:
            trial = codes.copy()
            trial[i] = SWAP if model.can[i, SWAP] else KEEP
            outer(trial, k + 1)

    outer(tightest_codes(model), 0)   # undecided maps hold their tightest class
    if best is None:
        raise ValueError("no classification fits the budget")
    return ExactResult(best, best_time, sims, time.perf_counter() - started)


def brute_force(model: SimModel, budget: int, timing: str = "early") -> ExactResult:
    """Every allowed classification simulated (3^n): the check on ``exact_best``."""
    started = time.perf_counter()
    best_time, best, sims = math.inf, None, 0
    for combo in itertools.product(*[[c for c in range(3) if model.can[i, c]]
                                     for i in range(model.m)]):
        codes = np.array(combo, np.int64)
        if not fits(model, codes, budget):
            continue
        sims += 1
        result = run(model, codes, timing, budget)
        if result.feasible and result.time_s < best_time:
            best_time, best = result.time_s, codes
    if best is None:
        raise ValueError("no classification fits the budget")
    return ExactResult(best, best_time, sims, time.perf_counter() - started)
