"""Every policy under tight budgets: feasible plans fit, infeasible ones say why, bad budgets
raise with the minimum; each baseline follows its own rule; PoocH's steps do what they claim."""
from __future__ import annotations

import numpy as np
import pytest

from pooch_ext.errors import BudgetTooSmallError
from pooch_ext.policies import POLICY_NAMES, get_policy
from pooch_ext.policies.search import SearchStats
from pooch_ext.sim.model import compile_profile, is_conv
from pooch_ext.sim.budgets import budget_between, minimum_budget
from pooch_ext.sim.check import schedule_memory, validate_schedule
from pooch_ext.analytic.synthetic import random_profile


@pytest.fixture(scope="module")
def net():
    return random_profile(6, n_layers=9)


@pytest.mark.parametrize("name", POLICY_NAMES)
@pytest.mark.parametrize("frac", [0.0, 0.4])
def test_feasible_plans_fit_and_infeasible_ones_say_why(name, frac, net):
    budget = budget_between(net, frac)
    plan = get_policy(name).classify(net, budget, "pcie3")
    assert plan.policy == name and plan.budget_bytes == budget and plan.link == "pcie3"
    assert set(plan.classes) == set(net.feature_maps.tensor)
    assert validate_schedule(net, plan) == []
    if plan.feasible:
        assert plan.peak_bytes <= budget
        assert schedule_memory(net, plan.schedule, plan.configs).peak_bytes.max() <= budget
    else:
        assert plan.reason
    assert list(plan.table["tensor"]) == sorted(plan.classes)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_budget_below_minimum_raises_with_the_minimum(name, toy_profile):
    minimum = minimum_budget(toy_profile)
    with pytest.raises(BudgetTooSmallError) as info:
        get_policy(name).classify(toy_profile, minimum - 1)
    assert info.value.minimum_bytes == minimum
    assert get_policy("swap-all").classify(toy_profile, minimum).feasible


def test_unknown_policy_lists_the_known_ones():
    with pytest.raises(KeyError, match="swap-opt"):
        get_policy("pooh")


def test_in_core_fails_over_budget_and_fits_at_its_peak(net):
    plan = get_policy("in-core").classify(net, net.incore_peak_bytes - 1)
    assert not plan.feasible and "keeping every feature map needs" in plan.reason
    assert get_policy("in-core").classify(net, net.incore_peak_bytes).feasible


def test_budget_strings_are_parsed(toy_profile):
    plan = get_policy("swap-all").classify(toy_profile, "1MiB")
    assert plan.budget_bytes == 1 << 20


def test_speeds_are_ordered_like_the_paper_figure_15(net):
    budget = budget_between(net, 0.25)
    times = {n: get_policy(n).classify(net, budget, "pcie3").iteration_time_s
             for n in ("swap-all-nosched", "swap-all", "swap-opt", "pooch")}
    assert times["pooch"] <= times["swap-opt"] <= times["swap-all"] <= times["swap-all-nosched"]


def test_pooch_records_r_and_recomputes_only_where_r_was_below_one(net):
    stats = SearchStats()
    plan = get_policy("pooch").classify(net, budget_between(net, 0.25), "pcie3", refine=False, stats=stats)
    table = plan.table.set_index("tensor")
    recomputed = table.index[table["class"] == "recompute"]
    assert len(recomputed) and (table.loc[recomputed, "r"] < 1).all()
    assert stats.l_in > 0 and stats.leaves > 0 and stats.recompute_rounds > 0


def test_pooch_recomputes_more_on_a_slow_link(net):
    budget = budget_between(net, 0.25)
    slow = get_policy("pooch").classify(net, budget, "pcie3").counts["recompute"]
    fast = get_policy("pooch").classify(net, budget, "c2c").counts["recompute"]
    assert slow > fast


def test_superneurons_swaps_convolution_outputs_and_uses_their_timing(net):
    plan = get_policy("superneurons").classify(net, budget_between(net, 0.0), "pcie3")
    model = compile_profile(net)
    assert plan.swap_in_timing == "previous-conv"
    for i, t in enumerate(model.tensor):
        if is_conv(model.names[model.producer[i]]):
            assert plan.classes[int(t)] != "recompute"
    assert plan.counts["keep"] < model.m


def test_vdnn_conv_offloads_only_convolution_inputs(net):
    plan = get_policy("vdnn-conv").classify(net, net.incore_peak_bytes, "pcie3")
    readers = dict(zip(net.tensors.tensor, net.tensors.fwd_consumers))
    names = list(net.ops.name)
    for t, cls in plan.classes.items():
        assert (cls == "swap") == any("Convolution" in names[k] for k in readers[t])
    assert plan.swap_in_timing == "vdnn"


def test_sqrt_n_recomputes_and_never_swaps(net):
    plan = get_policy("sqrt-n").classify(net, budget_between(net, 0.5), "pcie3")
    assert plan.counts["swap"] == 0 and plan.counts["recompute"] > 0
    assert plan.feasible


def test_plan_table_columns_and_csv_round_trip(net, tmp_path):
    from pooch_ext.plan import TABLE_COLUMNS, Plan

    plan = get_policy("pooch").classify(net, budget_between(net, 0.25), "pcie3")
    assert tuple(plan.table.columns) == TABLE_COLUMNS
    assert np.isclose(plan.table.stall_s.sum(), plan.timeline.total_stall_s)
    again = Plan.read_csv(plan.to_csv(tmp_path / "plan.csv"))
    assert again.classes == plan.classes and again.policy == "pooch"


def test_a_fixed_rule_policys_refusal_names_the_least_budget_it_fits():
    """sqrt-n's refused plan (no checkpoint spacing fits: recompute-only) is not the plan it
    makes for a larger budget, and its refusal named that plan's peak as its minimum: on a
    user's ResNet 7422372 bytes, above the in-core need, where 4000000 ran. The refusal now
    names the least budget at which the policy fits (to 0.1%), and that budget fits."""
    from pooch_ext.analytic.tracing import analytic_profile
    from pooch_ext.errors import PolicyDoesNotFitError
    from pooch_ext.policies import fitting_plan
    from pooch_ext.sim.budgets import budget_between

    profile = analytic_profile("small-resnet", 32, None, gpu="v100-16gb")
    budget = budget_between(profile, 0.05)
    for name in ("sqrt-n", "vdnn-conv"):
        refused = get_policy(name).classify(profile, budget)
        with pytest.raises(PolicyDoesNotFitError) as error:
            fitting_plan(profile, name, budget)
        least = error.value.minimum_bytes
        assert budget < least <= refused.peak_bytes
        assert fitting_plan(profile, name, least).feasible
        if name == "sqrt-n":
            assert least < 0.6 * refused.peak_bytes
