"""The independent checker's rules, one negative case each, and the memory it reports.

validate_schedule and schedule_memory are what both the simulator and the executor are tested
against, so each rule must be able to fail: every case below breaks one rule of a sound
schedule on the toy profile and expects the checker to name it (a rule that silently stopped
checking passed every test before these existed).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from conftest import branchy_builder
from pooch_ext.errors import BudgetTooSmallError
from pooch_ext.policies import POLICY_NAMES, get_policy
from pooch_ext.policies.fill_keeps import fill_keeps
from pooch_ext.sim.model import KEEP, SWAP, codes_of, compile_profile
from pooch_ext.sim.budgets import budget_between, fits
from pooch_ext.sim.check import schedule_memory, validate_schedule
from pooch_ext.sim.engine import run, simulate
from pooch_ext.analytic.synthetic import random_profile


@pytest.fixture(scope="module")
def toy():
    return branchy_builder().build(update_s=1e-4)


@pytest.fixture(scope="module")
def swap_all(toy):
    plan = get_policy("swap-all").classify(toy, None)
    assert validate_schedule(toy, plan) == []
    return plan


def _rows(schedule: pd.DataFrame) -> list[tuple]:
    return list(zip(schedule.boundary, schedule.order, schedule.action, schedule.tensor))


def _schedule(rows: list[tuple]) -> pd.DataFrame:
    """A schedule from (boundary, order, action, tensor) rows, renumbering each boundary's
    order as listed."""
    frame = pd.DataFrame(rows, columns=["boundary", "order", "action", "tensor"])
    frame["order"] = frame.groupby("boundary").cumcount()
    return frame.sort_values(["boundary", "order"], kind="stable").reset_index(drop=True)


def _without(rows, *drop):
    return [r for r in rows if (r[0], r[2], r[3]) not in drop]


def _with(rows, *add, before=None):
    """Add (boundary, action, tensor) rows: at the end of their boundary, or just before the
    row ``before`` = (boundary, action, tensor)."""
    out = list(rows)
    for b, action, t in add:
        row = (b, 0, action, t)
        at = next((i for i, r in enumerate(out) if (r[0], r[2], r[3]) == before), None)
        if at is None:
            at = max([i + 1 for i, r in enumerate(out) if r[0] <= b], default=0)
        out.insert(at, row)
    return out


CASES = {
    # name: (edit of the swap-all rows, a phrase of the expected problem)
    "swap-out before its producer ran": (
        lambda r: _with(_without(r, (1, "swap_out", 2)), (0, "swap_out", 2)),
        "swap_out of 2: must be present"),
    "release without a swap-out": (
        lambda r: _without(r, (1, "swap_out", 2)), "release of 2: needs a swap-out first"),
    "swap-in of a present map": (
        lambda r: _without(r, (2, "release", 2)), "swap_in of 2: must be absent"),
    "wait for a map not being swapped in": (
        lambda r: _with(r, (5, "wait", 2)), "wait for 2: it is not being swapped in"),
    "recompute of a present map": (
        lambda r: _with(r, (1, "recompute", 2)), "recompute of 2: it is still present"),
    "free of an absent map": (
        lambda r: _with(r, (5, "free", 2)), "free of 2: it is not present"),
    "an op reads an absent map": (
        lambda r: _without(r, (11, "swap_in", 2), (20, "wait", 2)), "needs 2, which is absent"),
    "an op reads a map not waited for": (
        lambda r: _without(r, (20, "wait", 2)), "needs 2, which is not yet waited for"),
    "an op produces a present map": (
        lambda r: _with(r, (9, "recompute", 11)), "produces 11, which is already present"),
    "a map never freed": (
        lambda r: _without(r, (21, "free", 2)), "tensor 2 is never freed"),
    "drops and copies disagree": (
        lambda r: _with(r, (5, "free", 2)), "device copies but"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_rule_names_its_break(toy, swap_all, name):
    edit, phrase = CASES[name]
    broken = _schedule(edit(_rows(swap_all.schedule)))
    problems = validate_schedule(toy, broken)
    assert any(phrase in p for p in problems), problems


def test_recompute_needs_its_sources_present_and_waited_for(toy, swap_all):
    """Map 4 is rebuilt from map 2 in backward: sound only once 2 is back and waited for."""
    rows = _rows(swap_all.schedule)
    rows = _without(rows, (3, "swap_out", 4), (7, "release", 4), (11, "swap_in", 4))
    rows = _with(rows, (7, "free", 4))
    sound = _schedule(_with(rows, (11, "wait", 2), (11, "recompute", 4)))
    assert validate_schedule(toy, sound) == []
    early = _schedule(_with(rows, (11, "recompute", 4), before=(11, "swap_in", 2)))
    assert any("recompute of 4: source(s) [2] not present" in p
               for p in validate_schedule(toy, early))
    unwaited = _schedule(_with(rows, (11, "recompute", 4)))
    assert any("recompute of 4: source(s) [2] not present" in p
               for p in validate_schedule(toy, unwaited))


def test_table_level_problems(toy, swap_all):
    rows = _rows(swap_all.schedule)
    assert "unknown action" in validate_schedule(
        toy, _schedule([(1, 0, "teleport", 2)] + rows[1:]))[0]
    assert "are not feature maps" in validate_schedule(
        toy, _schedule(rows + [(5, 0, "free", 3)]))[0]
    assert "boundaries must lie" in validate_schedule(
        toy, _schedule(rows + [(toy.n_ops + 1, 0, "free", 2)]))[0]
    kept = dataclasses.replace(swap_all, classes={**swap_all.classes, 2: "keep"})
    assert any("tensor 2 is keep but the schedule has 'swap_out'" in p
               for p in validate_schedule(toy, kept))


def test_a_recomputation_adds_its_chains_scratch_to_the_peak(toy):
    """Rebuilding map 2 re-runs the stem convolution, whose im2col scratch is live beside it."""
    model = compile_profile(toy)
    i = model.index[2]
    rows = _rows(get_policy("in-core").classify(toy, None).schedule)
    last_fwd = len(toy.forward_ops)
    b = int(model.bwd_first[i])
    rows = _without(rows, (b + 1, "free", 2), (int(model.bwd_end[i]), "free", 2))
    schedule = _schedule(_with(rows, (last_fwd - 1, "free", 2), (b, "recompute", 2),
                               (int(model.bwd_end[i]), "free", 2)))
    assert validate_schedule(toy, schedule) == []
    memory = schedule_memory(toy, schedule)
    assert model.rc_extra[i] > model.peak_inc[b]           # the case where scratch matters
    assert memory.peak_bytes[b] - memory.bytes[b] == model.rc_extra[i]


@pytest.fixture(scope="module")
def profiles(toy):
    return {"toy": toy, "random-3": random_profile(3, n_layers=10),
            "random-7": random_profile(7, n_layers=14)}


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_the_simulators_peak_is_the_checkers_for_every_policy(profiles, policy):
    for name, profile in profiles.items():
        for fraction in (0.0, 0.4, 1.0):
            budget = budget_between(profile, fraction) if policy != "in-core" else None
            try:
                plan = get_policy(policy).classify(profile, budget)
            except BudgetTooSmallError:             # a policy refusing a budget: fine here
                continue
            memory = schedule_memory(profile, plan.schedule, plan.configs)
            assert validate_schedule(profile, plan) == [], (name, fraction)
            assert plan.peak_bytes == int(memory.peak_bytes.max()), (name, fraction)
            timeline = simulate(profile, plan, budget=plan.budget_bytes)   # the same budget
            assert int(timeline.peak_bytes) == plan.peak_bytes, (name, fraction)


def test_fill_keeps_keeps_what_fits_and_is_never_slower(profiles):
    for profile in profiles.values():
        model = compile_profile(profile)
        swapped = np.where(model.can[:, SWAP], SWAP, KEEP).astype(codes_of(model, {}).dtype)
        incore = int(profile.incore_peak_bytes)
        everything, _ = fill_keeps(model, swapped.copy(), incore)
        assert (everything[model.can[:, KEEP]] == KEEP).all()   # room for all: all kept
        budget = budget_between(profile, 0.3)
        if not fits(model, swapped, budget):
            continue
        filled, _ = fill_keeps(model, swapped.copy(), budget)
        assert fits(model, filled, budget)
        assert (filled == KEEP).sum() >= (swapped == KEEP).sum()
        assert (filled[swapped == KEEP] == KEEP).all()            # never un-keeps
        assert run(model, filled, budget=budget).time_s <= \
            run(model, swapped, budget=budget).time_s * (1 + 1e-9)
