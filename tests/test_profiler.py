"""Measured profiles: the real graph, measured times and kept bytes, all maps swapped."""
from __future__ import annotations

import numpy as np
import pytest

from pooch_ext.errors import ProfileError
from pooch_ext.hooks.model_state import resident_bytes
from pooch_ext.hooks.graph import GraphRecorder
from pooch_ext.hooks.measured_profile import IterationSample, build_profile, fit_link
from pooch_ext.testing import BranchyNet, make_optimizer, synthetic_batches, train
from pooch_ext.links import get_link
from pooch_ext.policies import get_policy
from pooch_ext.profile import Device, Profile
from pooch_ext.functions import RECOMPUTABLE
from pooch_ext.sim.budgets import budget_between
from conftest import tracked_device


def _profiled(budget=None, iters=3, batch=4):
    np.random.seed(0)
    model = BranchyNet()
    optimizer = make_optimizer(model, "adam")
    result = train(model, optimizer, synthetic_batches(iters, batch, (3, 16, 16), 5),
                   {"profile_iters": iters, "policy": None, "budget": budget, "verbose": False,
                    "device": tracked_device()})
    if result.error is not None:
        raise result.error
    return result.pooch, model


@pytest.fixture(scope="module")
def profiled():
    return _profiled()


def test_measured_profile_is_the_real_graph_with_measured_times(profiled):
    pooch, model = profiled
    profile = pooch.profile
    assert profile.validate() == []
    assert profile.meta["source"] == "measured" and profile.meta["measured_iterations"] == [1, 2]
    assert profile.device.kind == "cpu" and profile.meta["batch"] == 4
    np.random.seed(0)
    with GraphRecorder(BranchyNet()) as recorder:
        train(recorder.model, make_optimizer(recorder.model), synthetic_batches(1, 4, (3, 16, 16), 5))
    names = [op.name for op in recorder.traces[-1].ops]
    assert list(profile.forward_ops.name) == names
    assert (profile.ops.duration_s > 0).all()
    assert len(profile.backward_ops) == len(names) and len(profile.feature_maps) >= 8
    # Adam's moments included; the gradients train() clears before backward are events
    cleared = profile.meta["cleared_gradients"]
    assert cleared["bytes"] == sum(p.array.nbytes for p in model.params())
    assert profile.resident_bytes + cleared["bytes"] == resident_bytes(model)
    events = pooch.allocations
    assert list(events.iteration.unique()) == [0, 1, 2]
    assert set(events.kind) == {"malloc", "free"} and (events.bytes > 0).all()


def test_kept_bytes_are_measured_from_the_function_nodes(profiled):
    profile = profiled[0].profile
    dropout = int(profile.ops.index[profile.ops.name == "Dropout"][0])
    x = profile.ops.at[dropout, "inputs"][0]
    mask_bytes = int(profile.tensors.set_index("tensor").at[x, "bytes"])   # float32 mask
    other = profile.memory[(profile.memory.category == "other") & (profile.memory.kind == "malloc")]
    assert int(other[other.op == dropout].bytes.sum()) == mask_bytes
    pool = int(profile.ops.index[profile.ops.name == "MaxPoolingND"][0])
    assert int(other[other.op == pool].bytes.sum()) > 0                     # argmax indexes


def test_cpu_swap_times_are_the_copy_engines_and_the_profile_round_trips(profiled, tmp_path):
    profile = profiled[0].profile
    link = get_link("pcie3")
    assert profile.link == link
    fms = profile.feature_maps
    # measured on the copy engines: never faster than the emulated link
    assert (fms.swap_out_s >= [link.swap_out_s(b) for b in fms.bytes]).all()
    assert (fms.swap_in_s >= [link.swap_in_s(b) for b in fms.bytes]).all()
    assert Profile.load(profile.save(tmp_path / "p")) == profile


def test_the_runtime_between_ops_is_in_the_profile_and_the_simulated_time(profiled):
    profile = profiled[0].profile
    runtime = profile.ops.runtime_s
    assert (runtime >= 0).all() and runtime.iloc[1:].gt(0).sum() > len(runtime) // 2
    compute = float(profile.ops.duration_s.sum())
    assert profile.incore_time_s == pytest.approx(compute + float(runtime.sum()))
    plan = get_policy("in-core").classify(profile, None, None)
    frees = int((plan.schedule.action == "free").sum())      # the executor's, not Chainer's
    # a split measured faster than its whole op runs split even in core (the plan's configs)
    ops = profile.ops.set_index("op")
    split_gain = sum(ops.duration_s[op] - next(s for p, _, s in ops.configs[op] if p == pieces)
                     for op, pieces in plan.configs.items())
    assert plan.iteration_time_s == pytest.approx(profile.incore_time_s - split_gain
                                                  + frees * profile.action_s.get("free", 0))
    # the executor's actions, timed in the swap-all profiling iterations
    assert {"swap_out", "swap_in", "free"} <= set(profile.action_s)
    assert all(0 < seconds < 0.01 for seconds in profile.action_s.values())
    # recomputation re-runs the functions alone, each timed once per profiled iteration: a
    # chain costs its ops' rerun times
    fms = profile.feature_maps
    rerun = profile.ops.set_index("op").rerun_s
    assert all(r == pytest.approx(sum(rerun[k] for k in chain))
               for r, chain in zip(fms.recompute_s, fms.recompute_ops))
    forward = profile.forward_ops
    recomputable = forward[forward.name.isin(RECOMPUTABLE)]
    assert len(recomputable) >= 8 and (recomputable.rerun_s != recomputable.duration_s).all()
    bn = forward[forward.name == "BatchNormalization"]    # reapplies its stored statistics
    assert len(bn) and (bn.rerun_s < bn.duration_s).all()


def test_the_profilers_own_work_is_not_in_the_runtime_between_ops(monkeypatch):
    """What only profiling does between ops (its bookkeeping, timing reruns) is left out of
    the runtime a planned iteration is predicted with: made 3 ms per op here, it is absent."""
    import time

    from pooch_ext.hooks.profiler import Profiler

    measure = Profiler._saved_bytes

    def slow(self, function, index):
        time.sleep(0.003)
        return measure(self, function, index)
    monkeypatch.setattr(Profiler, "_saved_bytes", slow)
    profile = _profiled(iters=2)[0].profile
    forward = profile.forward_ops
    assert len(forward) > 10 and forward.runtime_s.iloc[1:].median() < 0.0015


def test_profiling_runs_all_swapped_so_a_network_over_budget_can_be_profiled(profiled):
    full = profiled[0].profile
    budget = budget_between(full, 0.5)
    pooch, _ = _profiled(budget=budget)
    runs = pooch.iterations
    assert list(runs.program) == ["on-demand", "profile", "profile"]
    assert (runs.peak_bytes <= budget).all()
    assert (runs.swap_outs >= len(full.feature_maps) - 1).all()
    assert pooch.profile.incore_peak_bytes > budget


def test_fit_link_recovers_bandwidth_and_latency():
    def sample(direction, bandwidth, latency):
        s = IterationSample(0, None)
        s.transfers = [(direction, b, latency + b / bandwidth) for b in (1e5, 1e6, 4e6, 1.6e7)]
        return s
    link = fit_link([sample("d2h", 12e9, 20e-6), sample("h2d", 24e9, 20e-6)])
    assert link.d2h_bytes_per_s == pytest.approx(12e9, rel=1e-6)
    assert link.h2d_bytes_per_s == pytest.approx(24e9, rel=1e-6)
    assert link.latency_s == pytest.approx(20e-6, rel=1e-4)
    assert fit_link([]) is None


def test_build_profile_refuses_samples_of_different_graphs():
    small, _ = _profiled(iters=2, batch=2)
    other = _profiled(iters=2, batch=4)[0]
    mixed = small.profiler.samples + other.profiler.samples
    with pytest.raises(ProfileError, match="different graphs"):
        build_profile(mixed, Device("x", 1 << 30, "host-sim"), get_link("pcie3"), 0)
    with pytest.raises(ProfileError, match="no profiled iteration"):
        build_profile([], Device("x", 1 << 30, "host-sim"), get_link("pcie3"), 0)


def test_runtime_between_ops_is_the_gap_less_the_actions_run_in_it():
    """The host time between op windows goes into the op after it, less the seconds the
    schedule's actions took in that gap (the simulator charges those per action); a gap
    holding an untimed action (done on demand) takes its phase's median."""
    import pandas as pd

    from pooch_ext.hooks.measured_profile import IterationSample, runtime_seconds
    from pooch_ext.hooks.profiler import _gaps
    from pooch_ext.hooks.device import WallTimer

    timers = []
    for window, (start, end) in enumerate([(0.0, 1.0), (1.5, 2.0), (2.25, 3.0), (3.0, 4.0)]):
        timer = WallTimer()
        timer.start_t, timer.end_t = start, end
        timers.append((window, timer))
    assert _gaps(list(reversed(timers))) == {1: 0.5, 2: 0.25, 3: 0.0}   # by start, not by key
    # the profiler's own seconds before a window are not the runtime's
    assert _gaps(timers, {2: 0.125, 3: 0.5}) == {1: 0.5, 2: 0.125, 3: 0.0}

    def sample(gaps, actions):
        s = IterationSample(1, None)
        s.gap_s = gaps
        s.schedule = pd.DataFrame({"boundary": [b for b, _ in actions],
                                   "order": range(len(actions)),
                                   "action": ["release"] * len(actions),
                                   "tensor": [0] * len(actions),
                                   "seconds": [v for _, v in actions],
                                   "waited": [v > 1 for _, v in actions]})
        return s

    nan = float("nan")
    samples = [sample({1: 0.1, 2: 0.5, 3: 9.0, 5: 0.4}, [(2, 0.25), (2, 0.05), (3, nan)]),
               sample({1: 0.3, 2: 0.2, 3: 8.0, 5: 0.6}, [(3, 7.8)])]
    between = runtime_seconds(samples, n_fwd=4)
    assert between[1] == pytest.approx(0.2)
    assert between[2] == pytest.approx(0.2)          # 0.5 - 0.3 and 0.2
    assert between[3] == pytest.approx(0.2)          # 8.0 - 7.8 (the other untimed: left out)
    assert between[5] == pytest.approx(0.5)          # backward ops have their own phase
    samples[0].schedule.loc[0, "seconds"] = nan      # only untimed in op 2's gap: median
    assert runtime_seconds(samples[:1], n_fwd=4)[2] == pytest.approx(0.1)


def test_action_seconds_are_medians_of_the_actions_that_did_not_wait():
    import pandas as pd

    from pooch_ext.hooks.measured_profile import IterationSample, action_seconds

    s = IterationSample(1, None)
    s.gap_s = {1: 0.0}
    s.schedule = pd.DataFrame({"boundary": [1, 1, 2, 2, 3], "order": range(5),
                               "action": ["swap_out", "swap_out", "release", "release", "free"],
                               "tensor": [0, 1, 0, 1, 0],
                               "seconds": [1e-4, 3e-4, 5e-6, 0.2, float("nan")],
                               "waited": [False, False, False, True, False]})
    assert action_seconds([s]) == pytest.approx({"swap_out": 2e-4, "release": 5e-6})
    s.gap_s = {}                                     # device timers: not the iteration's time
    assert action_seconds([s]) == {}


def test_the_profiler_is_attached_only_while_profiling():
    """The profiled iterations are measured; once the graph has its plan the executor runs
    alone (nothing timed, no sample, no allocation log, copies untimed)."""
    np.random.seed(0)
    model = BranchyNet()
    seen = []        # after each step (an iteration ends when the next begins): measured?

    def watch(result):
        runtime = result.pooch.runtime
        seen.append((runtime.profiler is result.pooch.profiler, runtime.timed_transfers))
    result = train(model, make_optimizer(model, "adam"),
                   synthetic_batches(6, 4, (3, 16, 16), 5),
                   {"profile_iters": 2, "policy": "swap-all", "verbose": False,
                    "device": tracked_device()}, after_step=watch)
    assert result.error is None
    pooch = result.pooch
    assert seen == [(True, True)] * 2 + [(False, False)] * 4
    assert [s.iteration for s in pooch.profiler.samples] == [0, 1]
    assert pooch.profiler.last_sample is None and not pooch.profiler.measuring
    assert list(pooch.allocations.iteration.unique()) == [0, 1]
    assert all(not stats.transfers for stats in pooch.runtime.history)


def test_names_moved_out_of_the_profiler_module_stay_reachable_with_a_warning():
    import pooch_ext.hooks.profiler as old
    from pooch_ext.hooks import measured_profile

    with pytest.warns(DeprecationWarning, match="measured_profile"):
        assert old.build_profile is measured_profile.build_profile
    with pytest.raises(AttributeError):
        getattr(old, "no_such_name")  # noqa: B009 - the lookup is the test


def test_the_profilers_reruns_of_an_op_run_apart_from_the_budget(monkeypatch):
    """Timing an op's rerun makes its outputs a second time: on a GPU, under the pool's limit,
    that ran out of memory in every budgeted run (H200, 2026-11-27, session 30). It is
    measurement work, run apart from the budget and the peak as split measurements are."""
    import contextlib

    from pooch_ext.hooks import profiler

    device_class = type(tracked_device())
    apart, inside, depth = device_class.apart, [], [0]

    @contextlib.contextmanager
    def counted_apart(self):
        depth[0] += 1
        try:
            with apart(self):
                yield
        finally:
            depth[0] -= 1

    def rerun(function, inputs):
        inside.append(depth[0] > 0)
        return recompute(function, inputs)

    recompute = profiler.recompute
    monkeypatch.setattr(device_class, "apart", counted_apart)
    monkeypatch.setattr(profiler, "recompute", rerun)
    _profiled(iters=2)
    assert len(inside) > 10 and all(inside)
