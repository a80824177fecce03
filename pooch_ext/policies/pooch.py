"""pooch: keep / swap search, then recompute by r(X) (paper 4.4), then local refinement.

Steps 1 and 2 are the paper's (policies/search.py); step 3 is ours: a local search on the
budgeted time that repairs what the two-step order cannot see (keeps chosen before recompute
exists). ``refine=False`` gives the paper's algorithm alone (the benchmarks report both).
"""
from __future__ import annotations

from pooch_ext.plan import Plan
from pooch_ext.policies.common import Context
from pooch_ext.policies.search import SearchStats, keep_swap, recompute_step, refine as refine_step


def classify(profile, budget=None, link=None, refine: bool = True,
             stats: SearchStats | None = None) -> Plan:
    """The PoocH plan; ``stats`` (optional) receives the search's counters."""
    ctx = Context(profile, budget, link, "pooch")
    stats = stats if stats is not None else SearchStats()
    codes, _ = keep_swap(ctx.model, ctx.budget, stats=stats)
    codes, _ = recompute_step(ctx.model, codes, ctx.budget, stats=stats)
    if refine:
        codes, _ = refine_step(ctx.model, codes, ctx.budget, stats=stats)
    return ctx.plan(codes, "early", r=stats.r)
