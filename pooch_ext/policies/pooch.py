"""pooch: keep / swap search, then recompute by r(X) (paper 4.4), then local refinement.

Steps 1 and 2 are the paper's (policies/search.py, policies/recompute.py); step 3 is ours
(policies/refine.py): a local search on the budgeted time that repairs what the two-step
order cannot see (keeps chosen before recompute exists). It refines several starting plans,
a little each and then the most promising one with the rest of its simulation limit
(refine.multi_start): the paper's two steps; step 1 alone (r(X) ignores the budget, so
step 2 can lose time under it); the fastest checkpoint plan
(policies/sqrt_n.py), which swaps nothing and so is as fast on a slow link as on a fast one;
and all-swap, where step 1 itself starts. Where no checkpoint plan fits, the checkpoints
swapped instead of kept (most maps rebuilt) are refined apart with half the limit more, and
where they end faster, with the other half too (the leader gets the rest, as in multi_start):
ResNet-50 b512 on pcie3 at 0.3 of its in-core need, 1905 ms, against 1918 ms with the half
alone and 2017 ms without them. On slow links the paper's steps start far from a
good plan (ResNet-50 on an H100 at 8 GB/s: 0.28 of in-core speed, recomputation alone 0.79),
and a search that only refined them, with a limit it used up, was not monotone in the link's
speed. Where every refinement stopped with half of its limit or more unspent (small
networks, some budgets of larger ones), the same seeds are also searched on the link at
half its speed, and that plan refined on the real link (policies/slower_link.py): a single
call had given a random 16-layer network a 25% slower plan at 1 GB/s than at 0.5. Memory
left over is then filled with keeps where that costs no predicted time.
``refine=False`` gives the paper's algorithm alone, the policy "pooch-paper" (the benchmarks
report both).

Under a host budget every step counts a plan beyond it as infeasible, and the refinement
gets one more seed: the least-swapping plan (sim.budgets.least_swap_codes), which meets every
host budget from ``minimum_host_budget`` on, so a feasible plan is found wherever the
budgets are not refused. The paper's steps alone have no such seed and may end infeasible.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from pooch_ext.links import Link
from pooch_ext.plan import Plan
from pooch_ext.policies.common import Context
from pooch_ext.policies.fill_keeps import fill_keeps
from pooch_ext.policies.recompute import recompute_step
from pooch_ext.policies.refine import multi_start, refine as refine_codes, refine_budget
from pooch_ext.policies.search import Evaluator, SearchStats, keep_swap
from pooch_ext.policies.slower_link import or_from_slower_link
from pooch_ext.policies.sqrt_n import best_checkpoints, swapped_checkpoints
from pooch_ext.profile import Profile
from pooch_ext.sim.budgets import fits, least_swap_codes, tightest_codes
from pooch_ext.sim.model import SimModel, codes_of, search_memo


def classify(profile: Profile, budget: int | str | None = None, link: Link | str | None = None,
             refine: bool = True, stats: SearchStats | None = None,
             host_budget: int | str | None = None, seeds: Sequence[Plan] = (),
             search_factor: float = 1.0) -> Plan:
    """The PoocH plan ("pooch-paper" without the refinement); ``stats`` (optional) receives
    the search's counters. ``seeds``: plans of the same profile to refine from as well (for
    example the plan for a smaller budget or a slower link: policies/sweep.py); the result
    is never slower here than any of them that fits, since the refinement only improves
    (``refine=False`` has no refinement and ignores them). ``search_factor``: the
    refinement's simulation limit times this (studies of plan quality against search time,
    experiments/planner_scale.py ``longer``; a longer search is not always faster: the limit
    also decides how multi_start shares it between seeds, and so where their scans restart)."""
    if isinstance(search_factor, bool) or not (isinstance(search_factor, (int, float))
                                               and 0 < search_factor < math.inf):
        raise ValueError(f"search_factor must be a number > 0, got {search_factor!r}")
    ctx = Context(profile, budget, link, "pooch" if refine else "pooch-paper", host_budget)
    host = ctx.host_budget
    stats = stats if stats is not None else SearchStats()
    with search_memo(ctx.model):
        kept, _ = keep_swap(ctx.model, ctx.budget, stats=stats, host_budget=host)
        codes, _ = recompute_step(ctx.model, kept, ctx.budget, stats=stats)
        if refine:
            # sparse spacings only rebuild more: the fastest that fits is dense (2..5 on the
            # paper's networks), so spacings beyond 2 sqrt(n) are not worth a deep net's time
            spacing = 2 * round(math.sqrt(ctx.model.m)) + 1
            checkpoints = best_checkpoints(ctx.model, ctx.budget, spacing)
            seeds_by_name = {"paper steps": codes, "keep/swap step": kept,
                             "checkpoints": checkpoints, "all swap": tightest_codes(ctx.model),
                             "least swap": (None if math.isinf(host)
                                            else least_swap_codes(ctx.model, ctx.budget))}
            for k, plan in enumerate(seeds):
                given = codes_of(ctx.model, plan.classes)
                if fits(ctx.model, given, ctx.budget, host):
                    seeds_by_name[f"given {k}"] = given
            limit = max(1, round(refine_budget(ctx.model) * search_factor))
            spent = stats.refine_simulations
            codes, _ = multi_start(ctx.model, seeds_by_name, ctx.budget, limit, stats=stats,
                                   host_budget=host)
            if checkpoints is None:
                codes = _or_swapped_checkpoints(ctx.model, codes, ctx.budget, spacing, stats,
                                                host, limit // 2)
            left = limit - (stats.refine_simulations - spent)
            if left >= limit / 2:       # every refinement stopped early (small networks)
                codes = or_from_slower_link(ctx.model, seeds_by_name, codes, ctx.budget, left,
                                            stats, host)
            codes, _ = fill_keeps(ctx.model, codes, ctx.budget, stats=stats, host_budget=host)
    return ctx.plan(codes, "early", r=stats.r)


def _or_swapped_checkpoints(model: SimModel, codes: np.ndarray, budget: int, spacing: int,
                            stats: SearchStats, host: float, limit: int) -> np.ndarray:
    """Where no checkpoint plan fits: the checkpoints swapped instead of kept, every other
    map rebuilt (sqrt_n.swapped_checkpoints), refined on their own with ``limit`` more (half
    the refinement's), where that ends faster than ``codes``; and where it does, refined
    on with ``limit`` again, which costs nothing where it loses and can only make it faster
    (ResNet-50 b512, pcie3, 0.3: 1918 -> 1905 ms; the same refinement from the same plan
    with twice the limit ends there too). Apart, not one more seed of ``multi_start``: a
    seed takes a share of the others' work, and as one it made a data-parallel case of
    results/ 0.7% slower; so the search's own plan is as before."""
    seed = swapped_checkpoints(model, budget, spacing)
    if seed is None:
        return codes
    ev = Evaluator(model, budget, stats, host)
    stats.seed_times["swapped checkpoints"] = ev.time(seed)
    refined, _ = refine_codes(model, seed, budget, limit, stats, ev)
    if ev.time(refined) >= ev.time(codes):
        return codes
    stats.seed = "swapped checkpoints"
    return refine_codes(model, refined, budget, limit, stats, ev)[0]


def faster(seeded: Plan, alone: Plan) -> Plan:
    """``seeded`` (a search given seeds) or ``alone`` (the same search without them), the
    faster that fits: a seed takes a share of the refinement's work, so the seeded search
    can end in a slower basin (0.27% on one point of results/scale/monotone.csv, 0.85% on a
    user's small network); either way never slower than pooch alone."""
    if alone.feasible and (not seeded.feasible
                           or alone.iteration_time_s < seeded.iteration_time_s):
        return alone
    return seeded
