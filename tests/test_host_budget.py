"""The host-memory budget: the host peak a plan holds (counted here from its schedule alone),
every policy under a host budget, the least host memory a plan needs and its refusal, PoocH
refusing before any update, the CLI flag."""
from __future__ import annotations

import itertools
import json
import math
from typing import Callable

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest

from pooch_ext.cli import main
from pooch_ext.errors import BudgetTooSmallError, HostBudgetTooSmallError
from pooch_ext.testing import make_optimizer
from pooch_ext.plan import Plan
from pooch_ext.policies import POLICY_NAMES, get_policy
from pooch_ext.sim.model import compile_profile, host_level
from pooch_ext.sim.budgets import budget_between, fits, minimum_budget, minimum_host_budget
from pooch_ext.sim.engine import simulate, simulate_plan
from pooch_ext.analytic.synthetic import random_profile
from test_runtime_promise import (batches, identical, moved, refused_cleanly,
                                  run, standard_loop)
from conftest import saved_profile


@pytest.fixture(scope="module")
def net():
    """At a tenth of the way from the minimum device budget to in-core, pooch swaps 352 MB
    here without a host budget; 88 MB is the least any plan needs."""
    return random_profile(2, n_layers=12)


def host_count(profile, schedule) -> tuple[list[int], int]:
    """Host bytes after each boundary's actions, and their peak, from the schedule rows alone:
    a swap-out takes a host copy of the map's bytes; the executor gives every copy back only
    when the iteration ends (no action before that frees one)."""
    nbytes = dict(zip(profile.feature_maps.tensor, profile.feature_maps.bytes))
    held, level, peak = 0, [], 0
    rows = schedule.sort_values(["boundary", "order"])
    by_boundary = {b: g for b, g in rows.groupby("boundary")}
    for b in range(profile.n_ops + 1):
        group = by_boundary.get(b)
        if group is not None:
            for action, tensor in zip(group.action, group.tensor):
                if action == "swap_out":
                    held += int(nbytes[int(tensor)])
                    peak = max(peak, held)
        level.append(held)
    return level, peak


def random_plan(profile, seed: int) -> Plan:
    rng = np.random.RandomState(seed)
    fms = profile.feature_maps
    classes = {int(t): str(rng.choice(["keep", "swap", "recompute"] if rc else ["keep", "swap"]))
               for t, rc in zip(fms.tensor, fms.can_recompute)}
    return Plan("random", classes)


# ---------------------------------------------------------------- the host peak

@pytest.mark.parametrize("seed", range(4))
def test_host_peak_equals_a_count_from_the_schedule(net, seed):
    plan = simulate_plan(net, random_plan(net, seed), "pcie3")
    timeline = plan.timeline
    level, peak = host_count(net, plan.schedule)
    assert plan.host_peak_bytes == timeline.host_peak_bytes == peak > 0
    assert list(timeline.memory.host_bytes) == level
    assert plan.host_budget_bytes is None       # unlimited: only the device budget decides
    assert plan.feasible == (plan.peak_bytes <= plan.budget_bytes)


def test_simulate_holds_a_plan_to_the_host_budget(net):
    plan = random_plan(net, 0)
    peak = simulate(net, plan, "pcie3").host_peak_bytes
    assert simulate(net, plan, "pcie3", host_budget=peak).feasible
    plan = simulate_plan(net, plan, "pcie3", host_budget=f"{peak - 1} B")
    assert not plan.timeline.feasible and not plan.feasible and plan.host_budget_bytes == peak - 1
    assert f"hold {peak} bytes on the host at once; host budget {peak - 1}" in plan.reason


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_each_policys_host_peak_equals_the_count(net, name):
    plan = get_policy(name).classify(net, budget_between(net, 0.3), "pcie3")
    assert plan.host_peak_bytes == host_count(net, plan.schedule)[1]
    model = compile_profile(net)
    codes = np.array([{"keep": 0, "swap": 1, "recompute": 2}[plan.classes[int(t)]]
                      for t in model.tensor])
    assert int(host_level(model, codes).max()) == plan.host_peak_bytes


# ---------------------------------------------------------------- policies under a host budget

@pytest.mark.parametrize("name", POLICY_NAMES)
@pytest.mark.parametrize("share", [0.0, 0.5])
def test_feasible_plans_respect_the_host_budget_and_others_say_why(net, name, share):
    budget = budget_between(net, 0.1)
    least = minimum_host_budget(net, budget)
    free = get_policy("swap-all").classify(net, budget, "pcie3").host_peak_bytes
    host_budget = int(least + share * (free - least))
    plan = get_policy(name).classify(net, budget, "pcie3", host_budget=host_budget)
    assert plan.host_budget_bytes == host_budget
    if plan.feasible:
        assert host_count(net, plan.schedule)[1] <= host_budget
        assert plan.peak_bytes <= budget
    else:
        assert plan.reason
    if name == "pooch":
        assert plan.feasible
    if name in ("swap-all", "swap-all-nosched", "vdnn-all"):     # fixed rules: they swap all
        assert not plan.feasible and "host budget" in plan.reason


def test_pooch_trades_swaps_for_recomputation_under_a_tight_host_budget(net):
    budget = budget_between(net, 0.1)
    free = get_policy("pooch").classify(net, budget, "pcie3")
    least = minimum_host_budget(net, budget)
    assert 0 < least < free.host_peak_bytes
    tight = get_policy("pooch").classify(net, budget, "pcie3", host_budget=least)
    assert tight.feasible and tight.host_peak_bytes <= least and tight.peak_bytes <= budget
    assert tight.counts["recompute"] > free.counts["recompute"]
    assert tight.iteration_time_s >= free.iteration_time_s


def test_no_host_memory_at_all_where_recomputation_alone_fits():
    profile = random_profile(3, n_layers=12)
    budget = budget_between(profile, 0.0)
    assert get_policy("sqrt-n").classify(profile, budget, "pcie3").feasible
    assert get_policy("pooch").classify(profile, budget, "pcie3").host_peak_bytes > 0
    assert minimum_host_budget(profile, budget) == 0
    plan = get_policy("pooch").classify(profile, budget, "pcie3", host_budget="0")
    assert plan.feasible and plan.counts["swap"] == 0 and plan.host_peak_bytes == 0


# ---------------------------------------------------------------- the minimum and its refusal

def least_by_enumeration(profile, budget: int) -> int:
    """The fewest swapped bytes over every allowed classification that fits ``budget``."""
    model = compile_profile(profile)
    best = math.inf
    for combo in itertools.product(*[[c for c in range(3) if model.can[i, c]]
                                     for i in range(model.m)]):
        codes = np.array(combo)
        swapped = int(model.nbytes[codes == 1].sum())
        if swapped < best and fits(model, codes, budget):
            best = swapped
    return best


@pytest.mark.parametrize("fraction", [0.0, 0.2, 0.4])
def test_the_minimum_is_the_least_any_classification_needs(fraction):
    profile = random_profile(6, n_layers=9)          # 8 maps: 3^8 classifications
    budget = budget_between(profile, fraction)
    assert minimum_host_budget(profile, budget) == least_by_enumeration(profile, budget)


def test_the_minimum_is_zero_from_in_core_on_and_needs_a_possible_device_budget(net):
    assert minimum_host_budget(net, net.incore_peak_bytes) == 0
    with pytest.raises(BudgetTooSmallError):
        minimum_host_budget(net, minimum_budget(net) - 1)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_a_host_budget_below_the_minimum_is_refused_with_it(net, name):
    budget = budget_between(net, 0.1)
    least = minimum_host_budget(net, budget)
    with pytest.raises(HostBudgetTooSmallError) as info:
        get_policy(name).classify(net, budget, "pcie3", host_budget=least - 1)
    error = info.value
    assert isinstance(error, BudgetTooSmallError)
    assert (error.minimum_bytes, error.budget_bytes, error.device_budget_bytes) == \
        (least, least - 1, budget)
    assert "host budget" in str(error) and str(least) in str(error)


@pytest.mark.parametrize("bad", ["-1", "lots", "1.5 furlongs", float("nan")])
def test_bad_host_budgets_are_value_errors(net, bad):
    with pytest.raises(ValueError):
        get_policy("swap-all").classify(net, None, "pcie3", host_budget=bad)


# ---------------------------------------------------------------- PoocH

def conv_tanh() -> Callable[[], tuple]:
    """conv-BN-ReLU, conv, tanh, Linear: tanh has no recompute rule, so its output can only
    be kept or swapped, and the tightest plans need host memory."""
    def build() -> tuple:
        model = chainer.Sequential(L.Convolution2D(3, 8, 3, pad=1), L.BatchNormalization(8),
                                   F.relu, L.Convolution2D(8, 8, 3, pad=1), F.tanh,
                                   L.Linear(None, 5))
        return [model], [make_optimizer(model, "momentum")]
    return build


@pytest.fixture(scope="module")
def probe():
    """conv_tanh's profile (PoocH in-core), for budgets; the data the tests train on."""
    data = batches(4)
    outcome = run(conv_tanh(), standard_loop(data), {"profile_iters": 2, "policy": None})
    return outcome.pooch.profile, data


def test_pooch_refuses_an_impossible_host_budget_before_any_update(probe):
    profile, data = probe
    budget = budget_between(profile, 0.0)
    least = minimum_host_budget(profile, budget)
    assert least > 0
    under = run(conv_tanh(), standard_loop(data), {"profile_iters": 2, "budget": budget,
                                                    "host_budget": least - 1})
    assert isinstance(under.error, HostBudgetTooSmallError)
    assert under.error.minimum_bytes == least and refused_cleanly(conv_tanh(), under)


def test_pooch_trains_exactly_within_a_host_budget(probe):
    profile, data = probe
    budget = budget_between(profile, 0.0)
    host_budget = minimum_host_budget(profile, budget)
    plain = run(conv_tanh(), standard_loop(data), None)
    under = run(conv_tanh(), standard_loop(data), {"profile_iters": 2, "budget": budget,
                                                    "host_budget": host_budget})
    assert identical(plain, under) and moved(under) > 0
    plan = under.pooch.plan
    assert 0 < plan.host_peak_bytes <= host_budget == plan.host_budget_bytes


# ---------------------------------------------------------------- the command line

@pytest.fixture(scope="module")
def profile_dir(tmp_path_factory, net):
    return str(saved_profile(tmp_path_factory, net, "host"))


def test_cli_host_budget_json_and_text(profile_dir, net, tmp_path, capsys):
    budget = budget_between(net, 0.1)
    least = minimum_host_budget(net, budget)
    plan_csv = tmp_path / "plan.csv"
    code = main(["classify", profile_dir, "--link", "pcie3", "--budget", str(budget),
                 "--host-budget", str(least), "--out", str(plan_csv), "--json"])
    info = json.loads(capsys.readouterr().out)
    assert code == 0 and info["feasible"] and info["host_peak_bytes"] <= least
    assert info["host_budget_bytes"] == info["minimum_host_budget_bytes"] == least
    code = main(["simulate", profile_dir, "--plan", str(plan_csv), "--link", "pcie3",
                 "--budget", str(budget), "--host-budget", str(least)])
    out = capsys.readouterr().out
    assert code == 0 and f"({info['host_peak_bytes']} bytes) swapped at once; host budget" in out
    code = main(["classify", profile_dir, "--policy", "swap-all", "--link", "pcie3",
                 "--budget", str(budget)])
    assert code == 0 and "swapped at once; no host budget" in capsys.readouterr().out
    code = main(["classify", profile_dir, "--policy", "swap-all", "--link", "pcie3",
                 "--budget", str(budget), "--host-budget", str(least), "--json"])
    info = json.loads(capsys.readouterr().out)
    assert code == 1 and not info["feasible"] and "host budget" in info["reason"]


@pytest.mark.parametrize("value, message", [("lots", "not a byte size"), ("1", "host budget")])
def test_cli_bad_host_budgets_are_one_line_and_exit_2(profile_dir, net, capsys, value, message):
    code = main(["classify", profile_dir, "--budget", str(budget_between(net, 0.1)),
                 "--host-budget", value])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
