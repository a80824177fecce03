"""PoocH's refinement: a faster link never gets a slower plan, the multi-start never ends
slower than a seed, the local search stops at a local optimum within its simulation limit."""
from __future__ import annotations

import numpy as np
import pytest

from pooch_ext.links import Link
from pooch_ext.policies import get_policy
from pooch_ext.policies.refine import multi_start, refine
from pooch_ext.policies.search import SearchStats, keep_swap
from pooch_ext.policies.sqrt_n import best_checkpoints, checkpoint_codes
from pooch_ext.sim.model import KEEP, compile_profile, codes_of
from pooch_ext.sim.budgets import budget_between, fits, minimum_budget, tightest_codes
from pooch_ext.sim.engine import run
from pooch_ext.analytic.synthetic import random_profile

GB = 1e9


def budgeted_time(model, codes, budget) -> float:
    result = run(model, codes, "early", budget)
    return result.time_s if result.feasible else np.inf


# cases where the refinement of the paper's steps alone ended 11-14% slower at 2 GB/s than
# the 1 GB/s plan runs at 2 GB/s
@pytest.mark.parametrize("seed,frac", [(3, 0.1), (0, 0.25)])
def test_a_faster_link_never_gets_a_slower_plan(seed, frac):
    profile = random_profile(seed, n_layers=12)
    budget = budget_between(profile, frac)
    previous = None
    for gbps in (1, 2, 4, 8, 16):
        link = Link(f"{gbps}GB/s", gbps * GB, gbps * GB)
        plan = get_policy("pooch").classify(profile, budget, link)
        assert plan.feasible
        if previous is not None:
            model = compile_profile(profile, link)
            slower_plan_here = budgeted_time(model, codes_of(model, previous), budget)
            assert plan.iteration_time_s <= slower_plan_here * (1 + 1e-9), gbps
        previous = plan.classes


def test_pooch_is_never_slower_than_its_seeds_or_the_baselines():
    profile = random_profile(6, n_layers=9)
    budget = budget_between(profile, 0.4)
    for link in (Link("slow", 1 * GB, 1 * GB), "pcie3", "nvlink2"):
        stats = SearchStats()
        pooch = get_policy("pooch").classify(profile, budget, link, stats=stats)
        assert stats.seed in stats.seed_times
        assert pooch.iteration_time_s <= min(stats.seed_times.values()) * (1 + 1e-12)
        paper = get_policy("pooch").classify(profile, budget, link, refine=False)
        assert pooch.iteration_time_s <= paper.iteration_time_s * (1 + 1e-12)
        for name in ("sqrt-n", "swap-opt", "swap-all", "superneurons"):
            other = get_policy(name).classify(profile, budget, link)
            if other.feasible:
                assert pooch.iteration_time_s <= other.iteration_time_s * (1 + 1e-12), name


def test_refine_stays_within_its_limit_and_ends_at_a_local_optimum():
    profile = random_profile(8, n_layers=12)
    budget = budget_between(profile, 0.25)
    model = compile_profile(profile, Link("2GB/s", 2 * GB, 2 * GB))
    start = tightest_codes(model)
    stats = SearchStats()
    limited, _ = refine(model, start, budget, max_simulations=15, stats=stats)
    assert stats.refine_simulations <= 15
    assert fits(model, limited, budget)
    assert budgeted_time(model, limited, budget) < budgeted_time(model, start, budget)
    done, _ = refine(model, limited, budget)
    assert budgeted_time(model, done, budget) <= budgeted_time(model, limited, budget)
    again_stats = SearchStats()
    again, _ = refine(model, done, budget, stats=again_stats)
    assert np.array_equal(again, done)      # nothing in the neighbourhood improves on it
    assert again_stats.refine_simulations > 0


def test_multi_start_shares_its_limit_and_skips_missing_seeds():
    profile = random_profile(3, n_layers=12)
    budget = budget_between(profile, 0.1)
    model = compile_profile(profile, Link("2GB/s", 2 * GB, 2 * GB))
    kept, _ = keep_swap(model, budget)
    seeds = {"all swap": tightest_codes(model), "step 1": kept, "none": None}
    stats = SearchStats()
    codes, _ = multi_start(model, seeds, budget, max_simulations=40, stats=stats)
    assert set(stats.seed_times) == {"all swap", "step 1"} and stats.seed in stats.seed_times
    assert 0 < stats.refine_simulations <= 40
    assert budgeted_time(model, codes, budget) < min(stats.seed_times.values())


def test_best_checkpoints_respects_the_spacing_limit():
    profile = random_profile(6, n_layers=9)
    model = compile_profile(profile)
    budget = budget_between(profile, 0.6)
    best = best_checkpoints(model, budget)
    assert best is not None and fits(model, best, budget)
    dense = best_checkpoints(model, budget, max_spacing=2)
    assert dense is None or any(np.array_equal(dense, checkpoint_codes(model, k)) for k in (1, 2))
    assert best_checkpoints(model, minimum_budget(profile) - 1) is None
    assert (checkpoint_codes(model, 1) == KEEP).all()


@pytest.mark.parametrize("seed", [0, 4, 9])
def test_keep_room_fill_keeps_what_a_walk_one_by_one_keeps(seed):
    from pooch_ext.policies.search import KeepRoom, keep_candidates

    profile = random_profile(seed, 16)
    model = compile_profile(profile, "pcie3")
    rng = np.random.default_rng(seed)
    for fraction in (0.0, 0.2, 0.5, 0.9):
        budget = budget_between(profile, fraction)
        room = KeepRoom(model, tightest_codes(model), budget)
        candidates = keep_candidates(model, tightest_codes(model))
        for order in (candidates, list(rng.permutation(candidates))):
            top, walked = room.top, []
            for i in order:                  # the definition: each in turn, where it fits
                if room.fits_keep(top, i):
                    top = room.keep(top, i)
                    walked.append(i)
            assert room.fill(room.top, order) == walked


@pytest.mark.parametrize("seed", [1, 5])
def test_a_search_memo_answers_as_a_fresh_simulation_does(seed):
    """Within a search the lifetimes are kept per recompute set and shared: plans that share
    a set, and sets seen again later, must simulate exactly as they do outside a search."""
    from pooch_ext.sim.model import RECOMPUTE, search_memo
    profile = random_profile(seed, n_layers=14)
    model = compile_profile(profile, Link("4GB/s", 4 * GB, 4 * GB))
    budget = budget_between(profile, 0.3)
    rng = np.random.default_rng(seed)
    rebuilt_sets = [rng.random(model.m) < p for p in (0.0, 0.3, 0.6)]
    trials = []
    for _ in range(24):            # sets revisited in random order, other classes at random
        codes = rng.integers(0, 2, model.m)
        codes[rebuilt_sets[rng.integers(3)]] = RECOMPUTE
        trials.append(np.where(model.can[np.arange(model.m), codes], codes, KEEP))
    fresh = [run(model, codes, "early", budget, record=True) for codes in trials]
    with search_memo(model):
        memoized = [run(model, codes, "early", budget, record=True) for codes in trials]
    for a, b in zip(fresh, memoized):
        assert (a.time_s, a.feasible, a.peak_bytes) == (b.time_s, b.feasible, b.peak_bytes)
        for key, value in a.trace.items():
            assert repr(value) == repr(b.trace[key]), key


def test_the_refinements_quick_floor_test_prunes_only_what_the_exact_test_prunes():
    """refine._surely_below decides on a compute floor summed in another order (from the
    base's): wherever it prunes, the exact floor, within 1e-11 of it, is pruned too."""
    from pooch_ext.policies.refine import _below, _surely_below
    rng = np.random.default_rng(0)
    decided = 0
    for _ in range(20000):
        best = float(rng.uniform(0.01, 10))
        approximate = best * float(1 + rng.normal(0, 1e-9))
        if _surely_below(approximate, best):
            decided += 1
            for exact in (approximate * (1 - 1e-11), approximate * (1 + 1e-11)):
                assert _below(exact, best)
    assert 0 < decided < 20000


@pytest.mark.parametrize("seed", [0, 9, 11])
def test_a_refinement_that_passes_where_another_went_ends_where_it_would_alone(seed):
    """Within a search the refinement passes over a move it already tried from the same
    classes (refine._Base.visited), which must change nothing: refining the same seeds one
    after another in one search ends where each ends alone, a move that won from some
    classes winning again when another refinement comes by, and the visits under one
    budget not passed over under another (seeds 9 and 11 ended elsewhere when they were)."""
    from pooch_ext.sim.model import search_memo

    profile = random_profile(seed, n_layers=14)
    model = compile_profile(profile, "pcie3")
    start = tightest_codes(model)
    runs = []                   # (budget, seed): two budgets, whose visits must not mix
    for fraction in (0.2, 0.6):
        budget = budget_between(profile, fraction)
        midway = refine(model, start, budget, 20)[0]    # where a refinement from start passes
        runs += [(budget, start), (budget, midway), (budget, start)]
    alone = [refine(model, codes, budget, 300)[0] for budget, codes in runs]
    with search_memo(model):
        shared = [refine(model, codes, budget, 300)[0] for budget, codes in runs]
    assert all(np.array_equal(a, b) for a, b in zip(alone, shared))
    assert not np.array_equal(alone[0], start)       # the refinement moved


def test_where_no_checkpoint_plan_fits_pooch_also_refines_the_checkpoints_swapped(monkeypatch):
    """Below the budgets a checkpoint plan fits, pooch also refines the checkpoints swapped
    instead of kept, every other map rebuilt (sqrt_n.swapped_checkpoints), apart from its
    search, taking it where it ends faster: ResNet-50 b512 on pcie3 at 0.3 of its in-core
    need went from 2017 ms to 1918 ms. It fits there, pooch is never slower than it, and
    never slower than its search without it (policy pooch with the seed turned off)."""
    from pooch_ext.policies import pooch as pooch_module
    from pooch_ext.policies.sqrt_n import swapped_checkpoints
    from pooch_ext.sim.model import SWAP

    found = 0
    for seed in range(6):
        profile = random_profile(seed, n_layers=16)
        model = compile_profile(profile, "pcie3")
        for fraction in (0.02, 0.05, 0.1, 0.2):
            budget = budget_between(profile, fraction)
            if best_checkpoints(model, budget, 9) is not None:
                continue
            codes = swapped_checkpoints(model, budget, 9)
            if codes is None:
                continue
            found += 1
            assert fits(model, codes, budget) and (codes == SWAP).any()
            stats = SearchStats()
            plan = get_policy("pooch").classify(profile, budget, "pcie3", stats=stats)
            assert "swapped checkpoints" in stats.seed_times
            assert plan.iteration_time_s <= run(model, codes, "early", budget).time_s
            with monkeypatch.context() as patch:
                patch.setattr(pooch_module, "swapped_checkpoints", lambda *a: None)
                without = get_policy("pooch").classify(profile, budget, "pcie3")
            assert plan.iteration_time_s <= without.iteration_time_s
    assert found    # (it pays on ResNet-50, not on these: planner_scale.py --parts gap)


def test_where_the_swapped_checkpoints_lead_they_get_the_rest_of_the_limit(monkeypatch):
    """Where the checkpoints swapped (refined apart with half the refinement's limit) end
    faster than the search, they are refined on with the other half, as multi_start gives
    its leader the rest: on ResNet-50 b512, pcie3, 0.3 of its in-core need (where they win)
    the second half makes the plan faster (1918 -> 1905 ms at the usual limit; a quarter of
    it here, to keep the test short); pooch then fills leftover memory with keeps."""
    from pooch_ext.analytic.tracing import analytic_profile
    from pooch_ext.policies import pooch as pooch_module
    from pooch_ext.policies.refine import refine_budget
    from pooch_ext.sim.model import SWAP

    calls = []

    def recorded(model, codes, budget, limit, stats, ev):
        refined = refine(model, codes, budget, limit, stats, ev)
        calls.append((codes, limit, refined[0], ev.time(codes), ev.time(refined[0])))
        return refined

    monkeypatch.setattr(pooch_module, "refine_codes", recorded)
    profile = analytic_profile("resnet50", 512, gpu="v100-16gb", conv="cudnn")
    budget, factor = int(0.3 * profile.incore_peak_bytes), 0.25
    stats = SearchStats()
    plan = get_policy("pooch").classify(profile, budget, "pcie3", stats=stats,
                                        search_factor=factor)
    assert stats.seed == "swapped checkpoints"
    (seed, first_limit, first, _, first_s), (start, limit, second, start_s, second_s) = calls
    half = round(refine_budget(compile_profile(profile, "pcie3")) * factor) // 2
    assert first_limit == limit == half and (seed == SWAP).any()
    assert np.array_equal(start, first) and start_s == first_s
    assert second_s < first_s * (1 - 1e-3) and plan.iteration_time_s <= second_s


def test_search_factor_scales_the_refinements_limit_and_one_changes_nothing():
    """pooch's ``search_factor`` (experiments/planner_scale.py ``longer``) multiplies the
    refinement's simulation limit: a small one stops the search at it, 1 is the default
    search itself; anything but a number > 0 is refused before any work."""
    from pooch_ext.analytic.synthetic import chain_profile
    from pooch_ext.policies.refine import refine_budget

    rng = np.random.default_rng(0)
    profile = chain_profile(rng.uniform(1e-4, 3e-4, 60).tolist(), nbytes=[4 << 20] * 60,
                            link="pcie3")
    budget = budget_between(profile, 0.3)
    limit = refine_budget(compile_profile(profile, "pcie3"))
    pooch = get_policy("pooch")
    short, whole = SearchStats(), SearchStats()
    cut = pooch.classify(profile, budget, "pcie3", stats=short, search_factor=0.05)
    plan = pooch.classify(profile, budget, "pcie3", stats=whole)
    assert cut.feasible and short.refine_simulations <= round(0.05 * limit) * 1.5
    assert short.refine_simulations < whole.refine_simulations
    same = pooch.classify(profile, budget, "pcie3", search_factor=1)
    assert same.classes == plan.classes and same.iteration_time_s == plan.iteration_time_s
    for bad in (0, -1.0, float("nan"), float("inf"), True, "2"):
        with pytest.raises(ValueError, match="search_factor"):
            pooch.classify(profile, budget, "pcie3", search_factor=bad)
