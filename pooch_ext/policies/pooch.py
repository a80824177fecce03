"""pooch: keep / swap search, then recompute by r(X) (paper 4.4), then local refinement.

Steps 1 and 2 are the paper's (policies/search.py); step 3 is ours: a local search on the
budgeted time that repairs what the two-step order cannot see (keeps chosen before recompute
exists), and the result is never slower than step 1's; memory left over is then filled with
keeps where that costs no predicted time. ``refine=False`` gives the paper's algorithm alone
(the benchmarks report both).
"""
from __future__ import annotations

import math

from pooch_ext.plan import Plan
from pooch_ext.policies.common import Context
from pooch_ext.policies.search import SearchStats, fill_keeps, keep_swap, recompute_step
from pooch_ext.policies.search import refine as refine_step
from pooch_ext.simulator import run


def classify(profile, budget=None, link=None, refine: bool = True,
             stats: SearchStats | None = None) -> Plan:
    """The PoocH plan; ``stats`` (optional) receives the search's counters."""
    ctx = Context(profile, budget, link, "pooch")
    stats = stats if stats is not None else SearchStats()
    kept, _ = keep_swap(ctx.model, ctx.budget, stats=stats)
    codes, _ = recompute_step(ctx.model, kept, ctx.budget, stats=stats)
    if refine:
        codes, _ = refine_step(ctx.model, codes, ctx.budget, stats=stats)
        # r(X) ignores the budget, so step 2 can lose time under it: never end slower than step 1
        if budgeted_time(ctx.model, kept, ctx.budget) < budgeted_time(ctx.model, codes, ctx.budget):
            codes = kept
        codes, _ = fill_keeps(ctx.model, codes, ctx.budget, stats=stats)
    return ctx.plan(codes, "early", r=stats.r)


def budgeted_time(model, codes, budget: int) -> float:
    result = run(model, codes, "early", budget)
    return result.time_s if result.feasible else math.inf
