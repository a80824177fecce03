"""The simulator's walk in C (sim/fastwalk.py) gives what the walk in Python gives, bit for
bit, on random plans, budgets, link speeds, action costs and cutoffs, on networks with
convolution configurations too; the searches choose the same plans with either; and where
the C walk cannot be had, the Python one runs."""
from __future__ import annotations

import math

import numpy as np
import pytest

from pooch_ext.analytic.synthetic import random_profile
from pooch_ext.analytic.tracing import analytic_profile
from pooch_ext.links import Link
from pooch_ext.policies import get_policy
from pooch_ext.sim import fastwalk
from pooch_ext.sim.budgets import budget_between
from pooch_ext.sim.engine import run
from pooch_ext.sim.model import KEEP, compile_profile

needs_c = pytest.mark.skipif(fastwalk.library() is None,
                             reason=f"no C walk here: {fastwalk.failure}")
FIELDS = ("time_s", "feasible", "peak_bytes", "reason", "forward_end_s", "l_out", "l_in",
          "delayed", "cut_short", "host_peak_bytes")


def _walks(model, codes, budget, cutoff, monkeypatch) -> tuple:
    fast = run(model, codes, "early", budget, cutoff=cutoff)
    with monkeypatch.context() as patch:
        patch.setenv("POOCH_PYTHON_WALK", "1")
        slow = run(model, codes, "early", budget, cutoff=cutoff)
    return fast, slow


def _same(fast, slow) -> None:
    for name in FIELDS:
        assert getattr(fast, name) == getattr(slow, name), name
    for name in ("stall_d2h", "stall_h2d", "dur"):
        assert np.array_equal(getattr(fast, name), getattr(slow, name)), name


def _cases(seed: int):
    rng = np.random.default_rng(seed)
    if seed % 4 == 3:       # convolutions with configurations (their own durations and peaks)
        profile = analytic_profile("small-resnet", 8, conv="im2col")
    else:
        profile = random_profile(seed, n_layers=int(rng.integers(4, 24)))
    if rng.random() < 0.5:      # host seconds per action, as measured profiles have
        profile.action_s.update({"swap_out": 1e-4, "release": 2e-5, "swap_in": 1e-4,
                                 "wait": 1e-5, "recompute": 3e-5, "free": 1e-6})
    gbps = float(rng.choice([0.5, 4, 32]))
    model = compile_profile(profile, Link(f"{gbps}GB/s", gbps * 1e9, gbps * 1e9))
    for _ in range(12):
        codes = rng.integers(0, 3, model.m)
        codes = np.where(model.can[np.arange(model.m), codes], codes, KEEP)
        budget = budget_between(profile, float(rng.random())) if rng.random() < 0.9 \
            else math.inf
        yield model, codes, budget, rng


@needs_c
@pytest.mark.parametrize("seed", range(8))
def test_the_c_walk_equals_the_python_walk_bit_for_bit(seed, monkeypatch):
    for model, codes, budget, rng in _cases(seed):
        fast, slow = _walks(model, codes, budget, math.inf, monkeypatch)
        _same(fast, slow)
        if slow.feasible:       # asked only whether it ends before a cutoff
            cutoff = slow.time_s * float(rng.uniform(0.7, 1.1))
            _same(*_walks(model, codes, budget, cutoff, monkeypatch))


@needs_c
@pytest.mark.parametrize("seed,fraction", [(2, 0.2), (5, 0.5)])
def test_pooch_chooses_the_same_plan_with_either_walk(seed, fraction, monkeypatch):
    profile = random_profile(seed, n_layers=16)
    budget = budget_between(profile, fraction)
    fast = get_policy("pooch").classify(profile, budget, "pcie3")
    monkeypatch.setenv("POOCH_PYTHON_WALK", "1")
    slow = get_policy("pooch").classify(profile, budget, "pcie3")
    assert fast.classes == slow.classes
    assert fast.iteration_time_s == slow.iteration_time_s


def test_without_a_compiler_the_python_walk_runs(monkeypatch):
    monkeypatch.setattr(fastwalk, "_loaded", [None])
    profile = random_profile(1, n_layers=10)
    model = compile_profile(profile)
    result = run(model, np.ones(model.m, np.int64) * model.can[:, 1], "early",
                 budget_between(profile, 0.5))
    assert result.time_s > 0 and fastwalk.library() is None
