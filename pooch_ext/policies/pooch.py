"""pooch: keep / swap search, then recompute by r(X) (paper 4.4), then local refinement.

Steps 1 and 2 are the paper's (policies/search.py); step 3 is ours: a local search on the
budgeted time that repairs what the two-step order cannot see (keeps chosen before recompute
exists). It refines several starting plans, a little each and then the most promising one
with the rest of its simulation limit (search.multi_start): the paper's two steps; step 1
alone (r(X) ignores the budget, so step 2 can lose time under it); the fastest checkpoint plan
(policies/sqrt_n.py), which swaps nothing and so is as fast on a slow link as on a fast one;
and all-swap, where step 1 itself starts. On slow links the paper's steps start far from a
good plan (ResNet-50 on an H100 at 8 GB/s: 0.28 of in-core speed, recomputation alone 0.79),
and a search that only refined them, with a limit it used up, was not monotone in the link's
speed. Memory left over is then filled with keeps where that costs no predicted time.
``refine=False`` gives the paper's algorithm alone, the policy "pooch-paper" (the benchmarks
report both).

Under a host budget every step counts a plan beyond it as infeasible, and the refinement
gets one more seed: the least-swapping plan (sim.budgets.least_swap_codes), which meets every
host budget from ``minimum_host_budget`` on, so a feasible plan is found wherever the
budgets are not refused. The paper's steps alone have no such seed and may end infeasible.
"""
from __future__ import annotations

import math

from pooch_ext.links import Link
from pooch_ext.plan import Plan
from pooch_ext.policies.common import Context
from pooch_ext.policies.search import (SearchStats, fill_keeps, keep_swap, multi_start,
                                       recompute_step)
from pooch_ext.policies.sqrt_n import best_checkpoints
from pooch_ext.profile import Profile
from pooch_ext.sim.budgets import least_swap_codes, tightest_codes


def classify(profile: Profile, budget: int | str | None = None, link: Link | str | None = None,
             refine: bool = True, stats: SearchStats | None = None,
             host_budget: int | str | None = None) -> Plan:
    """The PoocH plan ("pooch-paper" without the refinement); ``stats`` (optional) receives
    the search's counters."""
    ctx = Context(profile, budget, link, "pooch" if refine else "pooch-paper", host_budget)
    host = ctx.host_budget
    stats = stats if stats is not None else SearchStats()
    kept, _ = keep_swap(ctx.model, ctx.budget, stats=stats, host_budget=host)
    codes, _ = recompute_step(ctx.model, kept, ctx.budget, stats=stats)
    if refine:
        # sparse spacings only rebuild more: the fastest that fits is dense (2..5 on the
        # paper's networks), so spacings beyond 2 sqrt(n) are not worth a deep net's time
        spacing = 2 * round(math.sqrt(ctx.model.m)) + 1
        seeds = {"paper steps": codes, "keep/swap step": kept,
                 "checkpoints": best_checkpoints(ctx.model, ctx.budget, spacing),
                 "all swap": tightest_codes(ctx.model),
                 "least swap": (None if math.isinf(host)
                                else least_swap_codes(ctx.model, ctx.budget))}
        codes, _ = multi_start(ctx.model, seeds, ctx.budget, stats=stats, host_budget=host)
        codes, _ = fill_keeps(ctx.model, codes, ctx.budget, stats=stats, host_budget=host)
    return ctx.plan(codes, "early", r=stats.r)
