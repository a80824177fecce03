"""Simulator on hand-built timelines whose answer is worked out by hand in each test.

The chain: x -> op0 -> t1 -> op1 -> t2 -> op2 -> t3 -> op3 (loss); op k keeps its input for
backward, so t1, t2, t3 are the feature maps, needed by backward ops 6, 5, 4. The link moves
4000 bytes/s with no latency, so a 12000-byte map takes 3 s each way.
"""
from __future__ import annotations

import numpy as np
import pytest

from pooch_ext.links import Link
from pooch_ext.plan import Plan
from pooch_ext.profile import Profile
from pooch_ext.sim.budgets import minimum_budget
from pooch_ext.sim.check import schedule_memory, validate_schedule
from pooch_ext.sim import engine as engine_module
from pooch_ext.sim.engine import simulate_plan
from pooch_ext.analytic.synthetic import chain_profile

SLOW = Link("slow", 4000, 4000, 0.0)


def chain(fwd=(2, 2, 2, 2), bwd=(2, 2, 2, 2), nbytes=12000, scratch=None):
    return chain_profile(list(fwd), list(bwd), nbytes=nbytes, link=SLOW, transient_bytes=scratch)


def run(profile, classes, timing="early", budget=None):
    plan = simulate_plan(profile, Plan("test", classes, swap_in_timing=timing), budget=budget)
    timeline = plan.timeline
    assert validate_schedule(profile, plan) == []
    memory = schedule_memory(profile, plan.schedule, plan.configs)
    assert np.array_equal(memory.peak_bytes, timeline.memory.peak_bytes)
    return plan, timeline


def actions(plan, tensor):
    s = plan.schedule[plan.schedule.tensor == tensor]
    return list(zip(s.boundary, s.action))


def test_in_core_time_is_the_sum_of_op_times():
    p = chain()
    _, tl = run(p, {1: "keep", 2: "keep", 3: "keep"})
    assert tl.iteration_time_s == pytest.approx(16.0)
    assert tl.peak_bytes == p.incore_peak_bytes
    assert tl.total_stall_s == 0


def test_overlap_hidden_costs_nothing():
    # 1 s swaps behind 2 s ops: t1 out [2,3], t2 out [4,5]; both back in during op3's backward
    p = chain(nbytes=4000)
    plan, tl = run(p, {1: "swap", 2: "swap", 3: "keep"})
    assert tl.iteration_time_s == pytest.approx(16.0)
    assert tl.total_stall_s == 0 and tl.l_in == [] and tl.l_out == []
    assert actions(plan, 2) == [(2, "swap_out"), (3, "release"), (4, "swap_in"), (5, "wait"),
                                (6, "free")]


def test_overlap_not_hidden_stalls_backward_and_names_the_tensors():
    # 3 s swaps: t2 out [5,8]; in [8,11] then t1 in [11,14]; op5 waits 10->11, op6 13->14
    p = chain()
    _, tl = run(p, {1: "swap", 2: "swap", 3: "keep"})
    assert tl.iteration_time_s == pytest.approx(18.0)
    stalls = tl.stalls.set_index("tensor").swap_in_stall_s
    assert stalls[2] == pytest.approx(1.0) and stalls[1] == pytest.approx(1.0)
    assert tl.l_in == [1, 2]
    assert list(tl.ops.start_s[4:]) == pytest.approx([8, 11, 14, 16])


def test_memory_stall_waits_for_the_swap_out_it_releases():
    # Before op2 the device holds x + t1 + t2 = 36000 bytes; op2 adds t3 and 12000 bytes of
    # scratch. The backward needs 48004 bytes at least, which is the minimum budget: op2
    # must wait until t1's swap-out (started at 2 s, 3 s long) finishes at 5 s.
    p = chain(scratch=[0, 0, 12000, 0])
    assert minimum_budget(p) == 48004
    plan, tl = run(p, {1: "swap", 2: "swap", 3: "swap"}, budget=48004)
    assert tl.feasible and tl.peak_bytes <= 48004
    assert tl.ops.start_s[2] == pytest.approx(5.0)
    assert tl.stalls.set_index("tensor").swap_out_stall_s[1] == pytest.approx(1.0)
    assert (2, "release") in actions(plan, 1) and 1 in tl.l_out
    # without the budget nothing waits in forward
    _, free = run(p, {1: "swap", 2: "swap", 3: "swap"})
    assert free.ops.start_s[2] == pytest.approx(4.0)


def test_early_swap_in_moves_a_swap_in_earlier_than_without_scheduling():
    # 1.5 s swaps, op2's backward is short (0.5 s): early starts t1's swap-in at boundary 4
    # (done 11), without scheduling it starts with op5 at 10 s (done 11.5)
    p = chain(bwd=(2, 2, 0.5, 2), nbytes=6000)
    early, tl_early = run(p, {1: "swap", 2: "swap", 3: "keep"}, "early")
    late, tl_late = run(p, {1: "swap", 2: "swap", 3: "keep"}, "previous-op")
    assert (4, "swap_in") in actions(early, 1) and (5, "swap_in") in actions(late, 1)
    assert tl_early.iteration_time_s == pytest.approx(15.0)
    assert tl_late.iteration_time_s == pytest.approx(15.5)


def test_early_swap_in_waits_for_memory_room():
    # budget leaves room for one swapped-in map besides the backward's own needs: t1's
    # swap-in can only start when t2 has been freed after op 5
    p = chain(nbytes=4000)
    _, unlimited = run(p, {1: "swap", 2: "swap", 3: "swap"})
    need = int(unlimited.memory.peak_bytes[5:].max())
    plan, tl = run(p, {1: "swap", 2: "swap", 3: "swap"}, budget=minimum_budget(p))
    assert tl.feasible and tl.peak_bytes <= minimum_budget(p) < need
    assert [b for b, a in actions(plan, 1) if a == "swap_in"] == [6]


def test_recompute_rebuilds_from_its_source_before_first_need():
    p = chain()
    plan, tl = run(p, {1: "keep", 2: "recompute", 3: "recompute"})
    # t3 (needed at op 4) is rebuilt from t2, itself rebuilt from t1: op1 + op2 again, 4 s
    assert actions(plan, 2) == [(3, "free"), (4, "recompute"), (6, "free")]
    # t3 is read by the loss (op 3) in forward, so it is dropped only at boundary 4
    assert actions(plan, 3) == [(4, "free"), (4, "recompute"), (5, "free")]
    assert tl.iteration_time_s == pytest.approx(16.0 + 4.0)
    assert tl.ops.recompute_s[4] == pytest.approx(4.0)


def test_budget_below_static_need_is_infeasible_with_a_reason():
    p = chain()
    plan, tl = run(p, {1: "keep", 2: "keep", 3: "keep"}, budget=p.incore_peak_bytes - 1)
    assert not tl.feasible and not plan.feasible and "budget" in tl.reason


@pytest.mark.parametrize("timing", ["early", "previous-op", "previous-conv", "vdnn"])
def test_every_timing_fits_at_the_minimum_budget(timing, toy_profile):
    classes = {int(t): "swap" for t in toy_profile.feature_maps.tensor}
    budget = minimum_budget(toy_profile)
    plan, tl = run(toy_profile, classes, timing, budget)
    assert tl.feasible and tl.peak_bytes <= budget


def test_validate_schedule_catches_a_use_after_release(toy_profile):
    classes = {int(t): "swap" for t in toy_profile.feature_maps.tensor}
    plan, _ = run(toy_profile, classes)
    broken = plan.schedule[plan.schedule.action != "wait"]
    assert any("not yet waited" in p for p in validate_schedule(toy_profile, broken))
    no_free = plan.schedule[plan.schedule.action != "free"]
    assert any("never freed" in p for p in validate_schedule(toy_profile, no_free))


def test_previous_conv_starts_each_swap_in_with_the_preceding_convolution(toy_profile):
    # backward convolutions run at ops 17, 18, 21; map 2 is first needed by op 20 (BN)
    plan, _ = run(toy_profile, {int(t): "swap" for t in toy_profile.feature_maps.tensor},
                  "previous-conv")
    assert [b for b, a in actions(plan, 2) if a == "swap_in"] == [18]
    # map 4 is first needed by op 17: no convolution runs before it in backward
    assert [b for b, a in actions(plan, 4) if a == "swap_in"] == [11]


def test_vdnn_prefetches_one_map_per_op_and_synchronizes_at_the_next(toy_profile):
    plan, _ = run(toy_profile, {int(t): "swap" for t in toy_profile.feature_maps.tensor}, "vdnn")
    sched = plan.schedule
    prefetch = sched[sched.action == "swap_in"]
    assert prefetch.groupby("boundary").size().max() <= 2   # an on-demand fetch + one prefetch
    # map 2 (needed at op 20) enters the window only at op 18 (next convolution: 21)
    assert [b for b, a in actions(plan, 2) if a == "swap_in"] == [18]
    assert (19, "wait") in actions(plan, 2) and (20, "wait") in actions(plan, 2)
    # map 4 is prefetched at op 12 and waited for right after, at op 13
    assert [b for b, a in actions(plan, 4) if a in ("swap_in", "wait")][:2] == [12, 13]


def test_an_edited_profile_simulates_like_a_fresh_equal_one():
    """Profiles are mutable: the compiled model is found by content, never by identity."""
    profile = chain()
    classes = {1: "swap", 2: "swap", 3: "keep"}
    before = run(profile, classes)[1].iteration_time_s
    profile.tensors["swap_out_s"] *= 10      # in place, after a simulation compiled it
    profile.tensors["swap_in_s"] *= 10
    profile.ops.loc[5, "duration_s"] = 7.0
    fresh = Profile(profile.ops.copy(), profile.tensors.copy(), profile.memory.copy(),
                    profile.resident_bytes, profile.device, profile.link, dict(profile.meta))
    edited = run(profile, classes)[1].iteration_time_s
    assert edited == run(fresh, classes)[1].iteration_time_s > before + 5


def test_each_action_costs_compute_its_measured_host_seconds(toy_profile):
    """An all-keep plan only frees: its time grows by exactly the frees' cost. A swapping
    plan grows by at most every action's cost (host time spent issuing can hide a stall)."""
    import dataclasses

    from pooch_ext.policies import get_policy

    def timed(policy, costs):
        profile = dataclasses.replace(toy_profile, action_s=costs)
        plan = get_policy(policy).classify(profile, None, None)
        return plan.iteration_time_s, plan.schedule

    base, schedule = timed("in-core", {})
    costly, _ = timed("in-core", {"free": 1e-3})
    assert set(schedule.action) == {"free"}
    assert costly - base == pytest.approx(1e-3 * len(schedule))
    base, schedule = timed("swap-all", {})
    costs = {action: 1e-3 for action in ("swap_out", "release", "swap_in", "wait", "free")}
    costly, charged = timed("swap-all", costs)
    assert base < costly <= base + 1e-3 * len(charged) + 1e-12


def test_bytes_held_between_ops_are_charged_beside_a_recompute_run_there():
    """A measured profile's held_between_ops (Chainer's backward loop holding an op's inputs
    and gradients until the next op starts) runs beside a recomputation at that boundary:
    the engine and the independent checker both charge it there, and nowhere else."""
    from pooch_ext.analytic.tracing import analytic_profile
    from pooch_ext.policies import classify

    from pooch_ext.sim.budgets import budget_between

    profile = analytic_profile("small-resnet", 8)
    plan = classify(profile, budget_between(profile, 0.2), "sqrt-n")
    points = sorted(set(plan.schedule.boundary[plan.schedule.action == "recompute"]))
    assert points
    before = schedule_memory(profile, plan.schedule, plan.configs).peak_bytes.to_numpy()
    held = 1 << 30                       # more than any op's own peak: it must show
    profile.meta["held_between_ops"] = [[int(b), held] for b in points]
    after = schedule_memory(profile, plan.schedule, plan.configs).peak_bytes.to_numpy()
    changed = np.flatnonzero(after != before)
    assert set(changed) == set(points) and (after[changed] > before[changed] + held // 2).all()
    again = simulate_plan(profile, Plan("again", dict(plan.classes)))
    assert again.peak_bytes == int(schedule_memory(profile, again.schedule,
                                                   again.configs).peak_bytes.max())
    assert again.peak_bytes >= held


class _CheckingEveryBoundary(engine_module._Run):
    """The engine with the tests it skips made at every boundary: a forced release wherever
    an op's top is over the budget, finished copies wherever some are waiting, the next
    swap-in wherever it is due (no memory of where it was blocked)."""

    over = property(lambda self: set(range(self.n)), lambda self, value: None)
    wait_until = property(lambda self: -1, lambda self, value: None)
    blocked = property(lambda self: (-1, -1, -1), lambda self, value: None)


@pytest.mark.parametrize("timing", ["early", "previous-op", "vdnn"])
def test_the_boundaries_the_engine_skips_change_no_run(timing, monkeypatch):
    from pooch_ext.analytic.synthetic import random_profile
    from pooch_ext.sim.budgets import budget_between
    from pooch_ext.sim.model import compile_profile

    rng = np.random.default_rng(3)
    runs = []
    for seed in range(6):
        profile = random_profile(seed, 14)
        model = compile_profile(profile, Link("1GB/s", 1e9, 1e9))
        for fraction in (-0.2, 0.0, 0.3):       # below the minimum budget too: overflows
            budget = budget_between(profile, max(fraction, 0.0)) + int(fraction * 1e5)
            for _ in range(4):
                codes = np.where(model.can, rng.random(model.can.shape), -1).argmax(axis=1)
                runs.append((model, codes, budget))
    skipping = [engine_module.run(m, c, timing, b, record=True) for m, c, b in runs]
    monkeypatch.setattr(engine_module, "_Run", _CheckingEveryBoundary)
    checking = [engine_module.run(m, c, timing, b, record=True) for m, c, b in runs]
    assert any(not r.feasible for r in skipping) and any(r.feasible for r in skipping)
    for fast, full in zip(skipping, checking):
        assert (fast.time_s, fast.peak_bytes, fast.reason, fast.l_in, fast.l_out) == (
            full.time_s, full.peak_bytes, full.reason, full.l_in, full.l_out)
        assert np.array_equal(fast.stall_h2d, full.stall_h2d)
        assert fast.trace["actions"] == full.trace["actions"]


@pytest.mark.parametrize("seed", range(4))
def test_the_timelines_per_op_stalls_are_its_copy_stalls_and_host_work_is_apart(seed):
    """The timeline drew every gap before an op as a stall, the runtime's host seconds for
    its actions included, so a plan with no copy stall showed red bars (a user trial: 30
    bars, 0.45 ms, under a title saying "stalls 0.0 ms"). Per op, the stall is now what is
    left after the boundary's actions (``host_s``) and recomputes: in sum, the copies'
    stalls; and the host seconds are the actions' costs."""
    from pooch_ext.analytic.synthetic import random_profile
    from pooch_ext.policies import get_policy
    from pooch_ext.sim.budgets import budget_between

    profile = random_profile(seed, n_layers=12)
    profile.action_s.update({"swap_out": 1e-4, "release": 2e-5, "swap_in": 1e-4,
                             "wait": 1e-5, "recompute": 3e-5, "free": 1e-6})
    stalled = []
    for fraction in (0.1, 0.5, 1.0):
        plan = get_policy("pooch").classify(profile, budget_between(profile, fraction), "pcie3")
        tl = simulate_plan(profile, plan, budget=budget_between(profile, fraction)).timeline
        assert tl.ops.stall_s.sum() == pytest.approx(tl.total_stall_s, rel=1e-9, abs=1e-12)
        charged = tl.schedule[tl.schedule.boundary < len(tl.ops)]
        charged = charged[charged.action != "recompute"].action.map(profile.action_s).sum()
        assert tl.ops.host_s.sum() == pytest.approx(charged, rel=1e-12)
        assert tl.ops.host_s.sum() > 0
        stalled.append(tl.total_stall_s > 0)
    assert stalled == [True, False, False]      # copies stall only at the tightest budget
