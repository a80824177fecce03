"""pooch's unspent simulations, spent on the same search with the link at half its speed.

Which basin a local search ends in depends on the link, so a single call of pooch could be
much slower on a faster link: a random 16-layer network at 0.3 of the way to its in-core
need took 25% longer per iteration at 1 GB/s than at 0.5 GB/s, where every seed refined to
a local optimum at 1 GB/s, while at 0.5 the swap the paper's steps chose cost too much and
the search left it for a plan that swaps nothing. The sweeps (policies/sweep.py) are monotone by
construction, seeding each search with its slower neighbour's plan; a single call has no
neighbour. Here it makes one: where the refinement stopped with at least half of its limit
unspent (every seed at a local optimum early: small networks, and some budgets of larger
ones), the same seeds are searched on the link at half the speed (every copy twice as
long), and that plan, which fits the budget on any link, is refined on the real one; it is
taken where it ends faster. It costs at most the limit the search left unspent: a
search that used its limit up (most budgets of ResNet-50 and ResNeXt-101 3D) is as before.
It makes single calls better, not monotone: planner_scale.py ``monotone`` and
experiments/monotone_random.py measure what is left.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from pooch_ext.policies.refine import multi_start, refine
from pooch_ext.policies.search import Evaluator, SearchStats
from pooch_ext.sim.bounds import in_core_time
from pooch_ext.sim.model import SimModel, search_memo

SLOWER = 2.0        # the slower link: each copy takes this many times as long


def slower_link(model: SimModel, factor: float = SLOWER) -> SimModel:
    """``model`` with every swap-out and swap-in ``factor`` times as long (latency too), its
    own search memo to come: the same maps and ops on a slower link."""
    return dataclasses.replace(model, so_s=model.so_s * factor, si_s=model.si_s * factor,
                               memo=None)


def or_from_slower_link(model: SimModel, seeds: dict[str, np.ndarray | None], codes: np.ndarray,
                        budget: int, limit: int, stats: SearchStats,
                        host_budget: float = math.inf) -> np.ndarray:
    """``codes``, or the plan ``seeds`` reach on the slower link refined on ``model``, where
    that ends faster; each search with half of ``limit`` simulations."""
    ev = Evaluator(model, budget, stats, host_budget)
    if ev.time(codes) <= in_core_time(model):
        return codes
    slow = slower_link(model)
    with search_memo(slow):
        found, _ = multi_start(slow, seeds, budget, max(1, limit // 2), SearchStats(),
                               host_budget)
    stats.seed_times["slower link"] = ev.time(found)
    refined, _ = refine(model, found, budget, max(1, limit // 2), stats, ev)
    if ev.time(refined) < ev.time(codes):
        stats.seed = "slower link"
        return refined
    return codes
