"""pooch over a grid of budgets or links, monotone by construction.

A local search is not monotone by itself: on a fine budget grid the plan for a larger
budget was up to 1.4% slower than the one for the budget below, although that plan still
fits. Here each search is seeded with the plan of its neighbour on the slower side (the
next smaller budget; the next slower link), and ``pooch.classify`` never returns a plan
slower than a seed that fits; pooch's plan without the seed is taken where it is faster
(twice the work: each point is classified both ways). A plan's simulated time does not
grow with the budget or with the link's speed (more room only lets swap-ins start earlier
and needs fewer forced releases; faster copies only end earlier; tests/test_planner_scale.py
checks both), so each plan is at least as fast as its neighbour's, and by induction as any
plan on the slower side.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from tqdm import tqdm

from pooch_ext.links import Link, get_link
from pooch_ext.plan import Plan
from pooch_ext.policies import pooch
from pooch_ext.profile import Profile
from pooch_ext.sim.budgets import require_budget, resolve_budget

ONE_GIB = 1 << 30


def classify_budgets(profile: Profile, budgets: Sequence[int | str], link: Link | str | None = None,
                     host_budget: int | str | None = None, progress: bool = False) -> list[Plan]:
    """pooch plans for ``budgets`` (a list, any order; the plans come back in that order), a
    larger budget never slower. A budget below the minimum raises BudgetTooSmallError before
    anything is classified, as ``pooch.classify`` does. ``progress``: a bar on stderr."""
    _require_list(budgets, "budgets")
    resolved = [resolve_budget(profile, b) for b in budgets]
    if resolved:
        require_budget(profile, min(resolved), "pooch")
    by_budget = _seeded(sorted(set(resolved)), lambda budget, seeds: pooch.classify(
        profile, budget, link, host_budget=host_budget, seeds=seeds), progress)
    return [by_budget[b] for b in resolved]


def classify_links(profile: Profile, links: Sequence[Link | str], budget: int | str | None = None,
                   host_budget: int | str | None = None, progress: bool = False) -> list[Plan]:
    """pooch plans for ``links`` (a list, any order; the plans come back in that order), each
    seeded with the plan of the next slower one: a link at least as fast both ways never gets
    a slower plan. Links are ordered by the seconds a GiB takes out and back in."""
    _require_list(links, "links")
    resolved = [get_link(link) for link in links]
    order = sorted(range(len(resolved)), key=lambda k: -_round_trip_s(resolved[k]))
    by_link = _seeded(order, lambda k, seeds: pooch.classify(
        profile, budget, resolved[k], host_budget=host_budget, seeds=seeds), progress)
    return [by_link[k] for k in range(len(resolved))]


def _seeded(order: list, classify_at: Callable[[Any, list[Plan]], Plan],
            progress: bool = False) -> dict:
    """Plans for the keys of ``order``, slowest side first, each seeded with the last
    feasible plan before it, or pooch's own plan there where that is faster
    (``pooch.faster``). Either is at least as fast as the neighbour's plan. {key: Plan}"""
    plans = {}
    previous: list[Plan] = []
    for key in tqdm(order, desc="sweep", unit="point", leave=False, disable=not progress):
        plan = classify_at(key, previous)
        if previous:
            plan = pooch.faster(plan, classify_at(key, []))
        plans[key] = plan
        if plan.feasible:
            previous = [plan]
    return plans


def _require_list(values: object, what: str) -> None:
    if isinstance(values, (str, bytes, int, Link)):
        raise TypeError(f"{what} must be a list (of one, if one): got {values!r}")


def _round_trip_s(link: Link) -> float:
    return link.swap_out_s(ONE_GIB) + link.swap_in_s(ONE_GIB)
