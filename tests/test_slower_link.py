"""pooch's unspent simulations on the link at half its speed (policies/slower_link.py)."""
from __future__ import annotations

import numpy as np

from pooch_ext.analytic.synthetic import random_profile
from pooch_ext.links import Link
from pooch_ext.policies import get_policy
from pooch_ext.policies.search import SearchStats
from pooch_ext.policies.slower_link import slower_link
from pooch_ext.sim.budgets import budget_between, tightest_codes
from pooch_ext.sim.engine import run
from pooch_ext.sim.model import compile_profile


def gbps(value: float) -> Link:
    return Link(f"{value:g}GB/s", value * 1e9, value * 1e9)


def test_a_faster_link_no_longer_gets_a_much_slower_plan():
    """The case that showed it: a random 16-layer network at 0.3 of the way to its in-core
    need got a plan 25% slower at 1 GB/s than at 0.5 GB/s. At 1 GB/s every seed's refinement
    stops early, so the search at 0.5 GB/s runs too, and its plan wins."""
    profile = random_profile(11, n_layers=16)
    budget = budget_between(profile, 0.3)
    pooch = get_policy("pooch")
    slow = pooch.classify(profile, budget, gbps(0.5))
    stats = SearchStats()
    fast = pooch.classify(profile, budget, gbps(1), stats=stats)
    assert stats.seed == "slower link" and "slower link" in stats.seed_times
    assert fast.iteration_time_s <= slow.iteration_time_s


def test_the_slower_link_doubles_every_copy_and_nothing_else():
    profile = random_profile(3, n_layers=12)
    model = compile_profile(profile, "pcie3")
    slow = slower_link(model)
    assert np.array_equal(slow.so_s, 2 * model.so_s) and np.array_equal(slow.si_s, 2 * model.si_s)
    assert np.array_equal(slow.dur, model.dur) and np.array_equal(slow.rc_s, model.rc_s)
    assert slow.memo is None and model.so_s is not slow.so_s
    budget = budget_between(profile, 0.3)
    codes = tightest_codes(model)
    assert run(slow, codes, "early", budget).time_s >= run(model, codes, "early", budget).time_s


def test_a_search_that_uses_its_limit_does_not_search_the_slower_link():
    """Where the refinement spends more than half its limit (large networks; here a tiny
    limit), pooch's plan and time are what they were without the slower link."""
    profile = random_profile(11, n_layers=16)
    budget = budget_between(profile, 0.3)
    stats = SearchStats()
    get_policy("pooch").classify(profile, budget, gbps(1), stats=stats, search_factor=0.002)
    assert "slower link" not in stats.seed_times
