"""The executor on hand-written schedules, the host-simulated device, graph changes, on demand."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import pooch_ext  # noqa: F401
import chainer
import chainer.functions as F

from pooch_ext.hooks.device import DeviceOutOfMemoryError, HostSimDevice
from pooch_ext.hooks.executor import Executor
from pooch_ext.hooks.program import ExecutorError, compile_program
from pooch_ext.hooks.graph import GraphRecorder
from pooch_ext.testing import (BranchyNet, make_optimizer, model_state, states_equal,
                                      synthetic_batches)
from pooch_ext.links import get_link
from pooch_ext.profile import Device


def _setup(seed=0):
    np.random.seed(seed)
    model = BranchyNet()
    return model, make_optimizer(model)


def _step(model, optimizer, x, t):
    loss = F.softmax_cross_entropy(model(x), t)
    model.cleargrads()
    loss.backward()
    optimizer.update()
    return float(loss.array)


def _plain(batches, seed=0):
    model, optimizer = _setup(seed)
    losses = [_step(model, optimizer, x, t) for x, t in batches]
    return losses, model_state(model, optimizer)


def _graph(batch=4):
    """The recorded graph of one iteration and a profile of it with dummy costs."""
    model, optimizer = _setup()
    with GraphRecorder(model) as recorder:
        _step(model, optimizer, *synthetic_batches(1, batch, (3, 16, 16), 5)[0])
    trace = recorder.traces[-1]
    cost = lambda tr, op: {"duration_s": 1e-3, "backward_s": 1e-3}   # noqa: E731
    profile = trace.to_builder(Device("test", 1 << 30), get_link("pcie3"), cost).build(
        loss=trace.loss, backward_order=trace.backward_order)
    return trace, profile


def _schedule(profile, classes):
    """The plainest schedule of ``classes``: swap out after the producer, release after the
    last forward use, swap in / recompute at the first backward use, free after the last."""
    rows = []
    for row in profile.feature_maps.itertuples():
        cls = classes.get(row.tensor, "keep")
        last_fwd = max([row.producer, row.held_until] + list(row.fwd_consumers))
        first_bwd, last_bwd = min(row.bwd_consumers), max(row.bwd_consumers)
        if cls == "swap":
            rows += [(row.producer + 1, "swap_out", row.tensor), (last_fwd + 1, "release", row.tensor),
                     (first_bwd, "swap_in", row.tensor), (first_bwd, "wait", row.tensor)]
        elif cls == "recompute":
            rows += [(last_fwd + 1, "free", row.tensor), (first_bwd, "recompute", row.tensor)]
        rows.append((last_bwd + 1, "free", row.tensor))
    frame = pd.DataFrame(rows, columns=["boundary", "action", "tensor"])
    frame["order"] = frame.groupby("boundary").cumcount()
    return frame[["boundary", "order", "action", "tensor"]]


def _tensor_of(trace, name, output=0):
    op = next(op for op in trace.ops if op.name == name)
    return op.outputs[output]


class Watching(Executor):
    """Records, at each forward boundary, whether the watched tensor has any reference."""

    def __init__(self, *args, watch=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.watch = list(watch)
        self.seen = []

    def on_forward_begin(self, index, function):
        super().on_forward_begin(index, function)
        if self.program is not None:
            self.seen.append((self.iteration, index,
                              tuple(self.maps.array_of(t) is None for t in self.watch)))


def _execute(batches, program_for=None, device=None, executor_cls=Executor, **kwargs):
    model, optimizer = _setup()
    device = device or HostSimDevice(measure=False)
    executor = executor_cls(model, device, **kwargs)
    losses = []
    with executor:
        for i, (x, t) in enumerate(batches):
            if i == 1 and program_for is not None:
                executor.use(program_for())
            losses.append(_step(model, optimizer, x, t))
    return losses, model_state(model, optimizer), executor


def test_swap_and_recompute_schedule_trains_exactly_and_really_drops_the_maps():
    trace, profile = _graph()
    swapped = _tensor_of(trace, "Concat")             # retained by BatchNormalization
    recomputed = _tensor_of(trace, "Dropout")         # retained by the last convolution
    schedule = _schedule(profile, {swapped: "swap", recomputed: "recompute"})
    program = compile_program(trace, profile, schedule, "hand")
    batches = synthetic_batches(4, 4, (3, 16, 16), 5)
    losses, state, executor = _execute(batches, lambda: program, executor_cls=Watching,
                                       watch=[swapped, recomputed])
    plain_losses, plain_state = _plain(batches)
    assert losses == plain_losses and states_equal(state, plain_state)
    for stats in executor.history[1:]:
        assert (stats.swap_outs, stats.swap_ins, stats.recomputes, stats.on_demand) == (1, 1, 1, 0)
    # between production and the last forward use a map is held; after it, by nothing at all
    maps = profile.feature_maps.set_index("tensor")
    # (or once the caller's Variable is gone, if it lived longer: measured as held_until)
    last_fwd = {t: max([r.producer, r.held_until] + list(r.fwd_consumers))
                for t, r in maps.iterrows()}
    checked = 0
    for _iteration, index, gone in executor.seen:
        for t, is_gone in zip((swapped, recomputed), gone):
            if index > maps.at[t, "producer"]:
                assert is_gone == (index > last_fwd[t])
                checked += 1
    assert checked > 10


def test_recompute_rebuilds_batch_normalization_without_touching_running_statistics():
    trace, profile = _graph()
    relu = next(op for op in trace.ops if op.name == "ReLU")
    target = relu.outputs[0]                          # chain: BatchNormalization -> ReLU
    chain = profile.tensors.set_index("tensor").at[target, "recompute_ops"]
    assert [trace.ops[k].name for k in chain] == ["BatchNormalization", "ReLU"]
    program = compile_program(trace, profile, _schedule(profile, {target: "recompute"}), "bn")
    batches = synthetic_batches(3, 4, (3, 16, 16), 5)
    losses, state, executor = _execute(batches, lambda: program)
    plain_losses, plain_state = _plain(batches)
    assert losses == plain_losses and states_equal(state, plain_state)   # avg_mean included
    assert [s.recomputes for s in executor.history] == [0, 1, 1]


def test_an_unexecutable_schedule_is_refused_before_training():
    trace, profile = _graph()
    target = _tensor_of(trace, "Concat")
    schedule = _schedule(profile, {target: "swap"})
    bad = schedule[schedule.action != "swap_in"]      # released, never brought back
    with pytest.raises(ExecutorError, match="not executable"):
        compile_program(trace, profile, bad, "bad")
    other_trace, _ = _graph(batch=4)
    other_trace.backward_order = other_trace.backward_order[:-1]
    with pytest.raises(ExecutorError, match="backward ops"):
        compile_program(other_trace, profile, schedule)


def test_a_changed_graph_stops_the_plan_and_training_stays_exact():
    trace, profile = _graph()
    swapped = _tensor_of(trace, "Concat")
    program = compile_program(trace, profile, _schedule(profile, {swapped: "swap"}), "hand")
    batches = synthetic_batches(2, 4, (3, 16, 16), 5) + synthetic_batches(2, 3, (3, 16, 16), 5, 7)
    reasons = []
    losses, state, executor = _execute(batches, lambda: program, on_deviation=reasons.append)
    plain_losses, plain_state = _plain(batches)
    assert losses == plain_losses and states_equal(state, plain_state)
    assert len(reasons) == 2 and "(3, 3, 16, 16)" in reasons[0]
    assert [bool(s.deviation) for s in executor.history] == [False, False, True, True]
    assert executor.history[2].swap_outs > 0 and executor.history[2].on_demand > 0


def test_without_a_program_unreferenced_maps_go_to_the_host_and_come_back_on_demand():
    batches = synthetic_batches(3, 4, (3, 16, 16), 5)
    losses, state, executor = _execute(batches)
    plain_losses, plain_state = _plain(batches)
    assert losses == plain_losses and states_equal(state, plain_state)
    stats = executor.history[-1]
    assert stats.swap_outs >= 8 and stats.on_demand >= stats.swap_outs


def test_the_host_simulated_budget_stops_a_plan_that_does_not_fit():
    trace, profile = _graph()
    keep_all = compile_program(trace, profile, _schedule(profile, {}), "in-core")
    batches = synthetic_batches(2, 4, (3, 16, 16), 5)
    _, _, free_run = _execute(batches, lambda: keep_all)
    need = free_run.history[-1].peak_bytes
    device = HostSimDevice(budget=need - 1, measure=False)
    with pytest.raises(DeviceOutOfMemoryError, match="out of memory"):
        _execute(batches, lambda: keep_all, device=device)
    _, _, exact_fit = _execute(batches, lambda: keep_all, device=HostSimDevice(budget=need, measure=False))
    assert exact_fit.history[-1].peak_bytes == need


def test_swapping_lowers_the_accounted_peak():
    trace, profile = _graph()
    everything = {int(t): "swap" for t in profile.feature_maps.tensor}
    swap_all = compile_program(trace, profile, _schedule(profile, everything), "swap-all")
    keep_all = compile_program(trace, profile, _schedule(profile, {}), "in-core")
    batches = synthetic_batches(2, 4, (3, 16, 16), 5)
    _, _, kept = _execute(batches, lambda: keep_all)
    _, _, swapped = _execute(batches, lambda: swap_all)
    assert swapped.history[-1].peak_bytes < kept.history[-1].peak_bytes
    assert swapped.history[-1].swap_outs == len(everything)


def test_the_executor_ignores_evaluation_under_no_backprop():
    trace, profile = _graph()
    program = compile_program(trace, profile, _schedule(profile, {_tensor_of(trace, "Concat"): "swap"}))
    model, optimizer = _setup()
    batches = synthetic_batches(3, 4, (3, 16, 16), 5)
    with Executor(model, HostSimDevice()) as executor:
        for i, (x, t) in enumerate(batches):
            if i == 1:
                executor.use(program)
            _step(model, optimizer, x, t)
            with chainer.no_backprop_mode(), chainer.using_config("train", False):
                model(x)
    assert all(not s.deviation for s in executor.history) and len(executor.history) == 3


def test_recompute_rules_rebuild_outputs_exactly_and_refuse_what_they_cannot():
    from chainer.functions.noise.dropout import Dropout
    from chainer.functions.normalization.batch_normalization import BatchNormalization

    from pooch_ext.hooks.recompute import RecomputeError, recompute

    rng = np.random.RandomState(0)
    x = rng.rand(4, 8, 6, 6).astype(np.float32)
    gamma, beta = rng.rand(8).astype(np.float32), rng.rand(8).astype(np.float32)
    mean, var = np.zeros(8, np.float32), np.ones(8, np.float32)
    node = BatchNormalization(mean=mean, var=var)
    y, = node.apply((x, gamma, beta))
    stats = mean.copy(), var.copy()
    again, = recompute(node, (x, gamma, beta))
    assert again.tobytes() == y.array.tobytes()
    assert np.array_equal(mean, stats[0]) and np.array_equal(var, stats[1])   # no 2nd update
    dropout = Dropout(0.5)
    z, = dropout.apply((x,))
    state = np.random.get_state()[1].copy()
    assert recompute(dropout, (x,))[0].tobytes() == z.array.tobytes()
    assert np.array_equal(np.random.get_state()[1], state)                   # no new mask drawn
    with pytest.raises(RecomputeError, match="no mask"):
        recompute(Dropout(0.5), (x,))
    softmax_node = F.softmax(chainer.Variable(x)).creator
    with pytest.raises(RecomputeError, match="Softmax has no exact recompute rule"):
        recompute(softmax_node, (x,))


def test_network_inputs_a_recompute_reads_go_with_the_loss_op():
    """A plan that recomputes from the batch holds it (``inputs_held``) while a backward pass
    may still need it; it had held it to the next forward, past a loop's ``del x, loss``:
    after the last op a planned iteration held one batch more than the profiling ones,
    38% over a user's MLP budget. It goes once the op whose backward ran first is gone."""
    import gc

    from pooch_ext.hooks.map_actions import MapActions

    class Node:
        pass

    maps = MapActions(None)
    batch = np.ones(1000, np.float32)
    maps.inputs_held[0] = batch
    node = Node()
    maps.hold_inputs_while(node)
    gc.collect()
    assert maps.inputs_held == {0: batch}       # the graph is alive: a later pass may come
    del node
    gc.collect()
    assert maps.inputs_held == {}


def test_an_op_that_would_not_fit_first_releases_only_maps_no_later_forward_op_reads():
    """MapActions.make_room, forced at every forward op (each op's planned peak made huge):
    maps swapped out are released ahead of their planned boundary (here the end of forward)
    only once no later forward op reads them, each once, the planned release then skipped
    and not logged again; training stays bit-identical to plain Chainer."""
    trace, profile = _graph()
    maps = profile.feature_maps
    n_fwd = len(trace.ops)
    schedule = _schedule(profile, {int(t): "swap" for t in maps.tensor})
    schedule.loc[schedule.action == "release", "boundary"] = n_fwd   # all at forward's end
    schedule = schedule.sort_values(["boundary", "order"], kind="stable")
    schedule["order"] = schedule.groupby("boundary").cumcount()
    program = compile_program(trace, profile, schedule, "late releases")
    program.op_peaks = [1 << 45] * len(program.op_peaks)     # no op fits: make room always
    device = HostSimDevice(measure=False)
    device.set_budget(1 << 44)
    released: list = []

    class Logging(Executor):
        def log_action(self, action, tensor, boundary=None, *args, **kwargs):
            super().log_action(action, tensor, boundary, *args, **kwargs)
            if action == "release" and self.iteration >= 1:
                released.append((self.iteration, tensor, self.executed[-1][0]))

    batches = synthetic_batches(4, 4, (3, 16, 16), 5)
    losses, state, executor = _execute(batches, lambda: program, device=device,
                                       executor_cls=Logging)
    plain_losses, plain_state = _plain(batches)
    assert losses == plain_losses and states_equal(state, plain_state)
    assert all(stats.room_releases > 0 and stats.on_demand == 0
               for stats in executor.history[1:])
    once = pd.Series([(i, t) for i, t, _ in released]).value_counts()
    assert len(once) == 3 * len(maps) and (once == 1).all()    # every map, once an iteration
    early = [(t, b) for _, t, b in released if b < n_fwd]
    assert early and all(program.last_read.get(t, -1) < b for t, b in early), early
