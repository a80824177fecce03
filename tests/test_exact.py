"""The exact reference agrees with brute force, and no policy beats it."""
from __future__ import annotations

import pytest

from pooch_ext.exact import brute_force, exact_best
from pooch_ext.policies import get_policy
from pooch_ext.sim.model import compile_profile
from pooch_ext.sim.budgets import budget_between
from pooch_ext.analytic.synthetic import random_profile


@pytest.mark.parametrize("seed,frac", [(1, 0.1), (6, 0.25), (8, 0.6)])
def test_branch_and_bound_equals_brute_force_and_bounds_policies(seed, frac):
    profile = random_profile(seed, n_layers=7)
    model = compile_profile(profile)
    budget = budget_between(profile, frac)
    best = exact_best(model, budget)
    assert best.time_s == pytest.approx(brute_force(model, budget).time_s, abs=1e-12)
    for name in ("pooch", "swap-opt", "superneurons", "sqrt-n"):
        plan = get_policy(name).classify(profile, budget)
        if plan.feasible:
            assert plan.iteration_time_s >= best.time_s - 1e-12
    pooch = get_policy("pooch").classify(profile, budget).iteration_time_s
    assert pooch <= best.time_s * 1.05


def test_exact_refuses_large_networks(toy_profile):
    big = random_profile(0, n_layers=30)
    with pytest.raises(ValueError, match="at most"):
        exact_best(compile_profile(big), big.incore_peak_bytes)
