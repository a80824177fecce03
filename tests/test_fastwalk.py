"""The simulator's C (sim/walk.c) gives what its Python reference gives, bit for bit: the
walk (sim/fastwalk.py) on random plans, budgets, link speeds, action costs and cutoffs, on
networks with convolution configurations too; a recompute set's lifetimes, a plan's static
memory and the keep room's fill on random plans; the searches choose the same plans with
either; and where the C cannot be had, the Python runs."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from pooch_ext.analytic.synthetic import random_profile
from pooch_ext.analytic.tracing import analytic_profile
from pooch_ext.links import Link
from pooch_ext.policies import get_policy
from pooch_ext.policies.search import KeepRoom
from pooch_ext.sim import clib, lifetimes as lt
from pooch_ext.sim.budgets import budget_between
from pooch_ext.sim.engine import run
from pooch_ext.sim.model import KEEP, compile_profile

needs_c = pytest.mark.skipif(clib.library() is None,
                             reason=f"no C walk here: {clib.failure}")
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
    monkeypatch.setattr(clib, "_loaded", [None])
    profile = random_profile(1, n_layers=10)
    model = compile_profile(profile)
    result = run(model, np.ones(model.m, np.int64) * model.can[:, 1], "early",
                 budget_between(profile, 0.5))
    assert result.time_s > 0 and clib.library() is None


def _recompute_heavy(model, rng) -> np.ndarray:
    """Random classes, half of them recompute where allowed (chains of rebuilt maps)."""
    codes = rng.choice(3, model.m, p=[0.25, 0.25, 0.5])
    return np.where(model.can[np.arange(model.m), codes], codes, KEEP)


@needs_c
@pytest.mark.parametrize("seed", range(6))
def test_lifetimes_static_memory_and_fill_in_c_equal_the_python_reference(seed):
    filled = ended = 0
    for model, codes, _budget, rng in _cases(seed):
        codes = _recompute_heavy(model, rng) if rng.random() < 0.5 else codes
        rebuilt = np.flatnonzero(codes == 2)
        # some maps needed only at the first backward op: a recompute reading one later
        # keeps it past its own last need (the paper's networks never do)
        early = rng.random(model.m) < 0.3
        for variant in (model, replace(model, bwd_first=np.where(early, model.n_fwd,
                                                                  model.bwd_first),
                                       bwd_end=np.where(early, model.n_fwd + 1, model.bwd_end))):
            c_parts = lt._rebuilt_parts_c(clib.library(), variant, rebuilt)
            py_parts = lt._rebuilt_parts_python(variant, rebuilt)
            assert np.array_equal(np.unique(c_parts[0]), np.unique(py_parts[0]))
            for c_part, py_part in zip(c_parts[1:5], py_parts[1:5]):
                assert np.array_equal(c_part, py_part)
            ended += int((py_parts[2] != variant.bwd_end).sum())
        life = lt.lifetimes(model, codes)
        for minimal in (True, False):
            peak = None if rng.random() < 0.5 else rng.integers(0, 10**6, model.n + 1)
            fast = lt.static_top(model, life, minimal, peak)
            slow = lt._static_top_numpy(model, life, minimal,
                                        model.peak_inc if peak is None else peak)
            assert all(np.array_equal(a, b) for a, b in zip(fast, slow))
        top = lt.static_top(model, life, True)[1]
        room = KeepRoom(model, codes, int(np.quantile(top, rng.random()) + top.max()) // 2)
        candidates = rng.permutation(model.m)[:rng.integers(1, model.m + 1)].tolist()
        kept = room.fill(top, candidates)
        assert kept == room._fill_numpy(top, candidates)
        filled += 0 < len(kept) < len(candidates)
        exact = candidates[0]       # a budget the first candidate meets exactly
        lo, hi = room.lo[exact], room.hi[exact]
        if lo < hi:
            room.budget = int(top[lo:hi].max() + model.nbytes[exact])
            assert room.fill(top, candidates)[:1] == room._fill_numpy(top, candidates)[:1] \
                == [exact]
    assert filled and ended     # some fills keep a part of their candidates; some ends move
