"""PoocH around real training loops: Trainer and hand-written, budgets, graph changes."""
from __future__ import annotations

import json

import numpy as np
import pytest

import pooch_ext  # noqa: F401
import chainer
import chainer.functions as F
import chainer.links as L
from chainer import training
from chainer.training import extensions

from pooch_ext.errors import BudgetTooSmallError, PolicyError, PoochError, UnknownNameError
from pooch_ext.testing import (BranchyNet, make_optimizer, model_state, states_equal,
                                      synthetic_batches, train)
from pooch_ext.plan import Plan
from pooch_ext.pooch import PoocH
from pooch_ext.sim.budgets import budget_between, minimum_budget
from conftest import tracked_device

SHAPE = (3, 16, 16)


def _trainer(out, n_iter, pooch_kwargs=None, seed=0):
    np.random.seed(seed)
    model = L.Classifier(BranchyNet())
    optimizer = make_optimizer(model, "adam")
    rng = np.random.RandomState(3)
    data = [(rng.rand(*SHAPE).astype(np.float32), np.int32(rng.randint(5))) for _ in range(24)]
    iterator = chainer.iterators.SerialIterator(data, 4, shuffle=False)
    updater = training.updaters.StandardUpdater(iterator, optimizer)
    trainer = training.Trainer(updater, (n_iter, "iteration"), out=str(out))
    trainer.extend(extensions.LogReport(trigger=(1, "iteration")))
    if pooch_kwargs is None:
        trainer.run()
        return model, optimizer, None
    with PoocH(model, **pooch_kwargs) as pooch:
        trainer.extend(pooch.extension())
        trainer.extend(extensions.PrintReport(["iteration", "main/loss", "pooch/profiling",
                                               "pooch/peak_mib"]))
        trainer.run()
    return model, optimizer, pooch


def test_trainer_runs_under_pooch_bit_identically_and_reports(tmp_path, capsys):
    model, optimizer, _ = _trainer(tmp_path / "plain", 6)
    p_model, p_optimizer, pooch = _trainer(tmp_path / "pooch", 6, {"profile_iters": 2,
                                                                    "policy": "swap-all"})
    assert states_equal(model_state(p_model, p_optimizer), model_state(model, optimizer))
    log = json.loads((tmp_path / "pooch" / "log").read_text())
    assert [entry["pooch/profiling"] for entry in log] == [1, 1, 0, 0, 0, 0]
    assert all(entry["pooch/peak_mib"] > 0 for entry in log)
    err = capsys.readouterr().err
    assert "PoocH: swap-all plan for Classifier: keep" in err and "predicted" in err
    assert pooch.plan.counts["swap"] > 0 and sum(pooch.plan.counts.values()) == len(
        pooch.profile.feature_maps)
    assert pooch.timeline is pooch.plan.timeline and pooch.timeline.iteration_time_s > 0
    assert pooch.profile.incore_peak_bytes > 0
    table = pooch.plan.to_csv(tmp_path / "plan.csv").read_text()
    assert table.startswith("tensor,") and "swap" in table
    runs = pooch.iterations
    assert list(runs.iteration) == list(range(6)) and list(runs.program[2:]) == ["swap-all"] * 4
    assert runs.compute_s.notna().all() and runs.wall_s.iloc[:-1].notna().all()


def _loop(n, pooch_kwargs=None, seed=0, batches=None):
    np.random.seed(seed)
    model = BranchyNet()
    optimizer = make_optimizer(model, "momentum")
    batches = batches or synthetic_batches(n, 4, SHAPE, 5)
    if pooch_kwargs is not None:
        pooch_kwargs = dict(pooch_kwargs, device=tracked_device())
    result = train(model, optimizer, batches, pooch_kwargs)
    return result, model_state(model, optimizer)


def test_a_budget_below_the_minimum_fails_before_the_first_update_and_changes_nothing():
    full = _loop(3, {"profile_iters": 3, "policy": None, "verbose": False})[0].pooch.profile
    minimum = minimum_budget(full)
    result, state = _loop(5, {"profile_iters": 3, "budget": minimum // 2, "policy": "swap-all",
                              "verbose": False})
    assert isinstance(result.error, BudgetTooSmallError)
    assert result.error.minimum_bytes == minimum and result.error.budget_bytes == minimum // 2
    assert result.losses == []                 # raised out of the first loss.backward()
    untouched = _loop(0)[1]                    # same seed, never trained
    assert states_equal(state, untouched)      # parameters, BN statistics, optimizer state


def test_a_policy_that_cannot_fit_fails_before_the_first_update_and_changes_nothing():
    full = _loop(3, {"profile_iters": 3, "policy": None, "verbose": False})[0].pooch.profile
    budget = budget_between(full, 0.5)
    result, state = _loop(5, {"profile_iters": 3, "budget": budget, "policy": "in-core",
                              "verbose": False})
    assert isinstance(result.error, BudgetTooSmallError)
    assert result.error.minimum_bytes == full.incore_peak_bytes
    assert "in-core" in str(result.error)
    assert result.losses == []
    assert states_equal(state, _loop(0)[1])


@pytest.mark.parametrize("policy", ["superneurons", "sqrt-n", "vdnn-conv"])
def test_a_refusal_names_the_least_budget_the_chosen_policy_runs_in(policy):
    """budget=1 named the smallest budget any plan reaches; a fixed-rule policy does not
    reach it, and the retry there was refused again with the policy's own minimum. The
    first refusal names that minimum, and the policy runs within it."""
    result, _ = _loop(5, {"profile_iters": 2, "budget": 1, "policy": policy, "verbose": False})
    assert isinstance(result.error, BudgetTooSmallError)
    least = result.error.minimum_bytes
    result, _ = _loop(5, {"profile_iters": 2, "budget": least, "policy": policy,
                          "verbose": False})
    assert result.error is None, result.error
    assert (result.pooch.iterations.peak_bytes.iloc[1:] <= least).all()


def test_the_snapshot_puts_back_parameters_gradients_and_statistics():
    from pooch_ext.hooks.model_state import ModelSnapshot

    np.random.seed(0)
    model = BranchyNet()
    x, t = synthetic_batches(1, 4, SHAPE, 5)[0]
    model.cleargrads()
    F.softmax_cross_entropy(model(x), t).backward()       # grads and BN statistics exist
    before = model_state(model)
    grads = {name: p.grad.copy() for name, p in model.namedparams()}
    snapshot = ModelSnapshot(model)
    optimizer = make_optimizer(model, "sgd")
    for _ in range(2):
        loss = F.softmax_cross_entropy(model(x), t)
        model.cleargrads()
        loss.backward()
        optimizer.update()
    assert not states_equal(model_state(model), before)
    snapshot.restore()
    assert states_equal(model_state(model), before)
    assert all(np.array_equal(p.grad, grads[name]) for name, p in model.namedparams())


def test_a_changed_graph_is_reported_and_profiled_again():
    batches = synthetic_batches(4, 4, SHAPE, 5) + synthetic_batches(5, 3, SHAPE, 5, seed=9)
    result, state = _loop(0, {"profile_iters": 2, "policy": "swap-all", "verbose": False},
                          batches=batches)
    plain, plain_state = _loop(0, batches=batches)
    assert result.error is None
    assert result.losses == plain.losses and states_equal(state, plain_state)
    pooch = result.pooch
    assert any("new graph" in m and "(3, 3, 16, 16)" in m for m in pooch.messages)
    assert sum("plan for" in m for m in pooch.messages) == 2
    runs = pooch.iterations
    # the new graph is measured from its first op on (on demand, as the first graph's first
    # iteration), so it needs no extra on-demand run
    assert list(runs.program) == ["on-demand", "profile", "swap-all", "swap-all", "on-demand",
                                  "profile", "swap-all", "swap-all", "swap-all"]
    assert list(runs.deviation != "") == [False] * 4 + [True] + [False] * 4


def test_user_held_outputs_stay_usable_after_backward():
    """A loop that keeps ``y`` and computes its accuracy after backward (a common pattern)."""
    def run(pooch_kwargs):
        np.random.seed(0)
        model = BranchyNet()
        optimizer = make_optimizer(model)
        accuracies = []

        def loop():
            for x, t in synthetic_batches(7, 4, SHAPE, 5):
                y = model(x)
                loss = F.softmax_cross_entropy(y, t)
                model.cleargrads()
                loss.backward()
                optimizer.update()
                accuracies.append(float(F.accuracy(y, t).array))
        if pooch_kwargs is None:
            loop()
            return accuracies, model_state(model, optimizer), None
        with PoocH(model, **pooch_kwargs) as pooch:
            loop()
        return accuracies, model_state(model, optimizer), pooch

    plain_acc, plain_state = run(None)[:2]
    acc, state, pooch = run({"profile_iters": 2, "policy": "swap-all", "verbose": False})
    assert acc == plain_acc and states_equal(state, plain_state)
    assert pooch.plan is not None


def test_a_single_profiled_iteration_is_enough_and_in_core_swaps_nothing():
    result, state = _loop(4, {"profile_iters": 1, "policy": "in-core", "verbose": False})
    plain, plain_state = _loop(4)
    assert result.losses == plain.losses and states_equal(state, plain_state)
    runs = result.pooch.iterations
    assert list(runs.program) == ["on-demand", "in-core", "in-core", "in-core"]
    assert (runs.swap_outs.iloc[1:] == 0).all() and (runs.recomputes == 0).all()


def test_bad_arguments_are_refused_up_front():
    model = BranchyNet()
    with pytest.raises(ValueError, match="profile_iters"):
        PoocH(model, profile_iters=0, policy="swap-all")
    with pytest.raises(UnknownNameError, match="unknown policy 'fastest'"):
        PoocH(model, policy="fastest")
    with pytest.raises(UnknownNameError, match="unknown link"):
        PoocH(model, link="pcie9", policy="swap-all")
    with pytest.raises(ValueError, match="byte size"):
        PoocH(model, budget="lots", policy="swap-all")
    # found by a user: these were taken (rounded, or failing later under another name)
    for count in (1.5, "3", True):
        with pytest.raises(ValueError, match="profile_iters must be a whole number"):
            PoocH(model, profile_iters=count)
    with pytest.raises(ValueError, match="byte size must be at most"):
        PoocH(model, budget=10**30)
    assert PoocH(model, profile_iters=np.int64(2)).profile_iters == 2


def test_a_users_policy_that_returns_no_plan_is_refused_before_any_update():
    result, state = _loop(4, {"profile_iters": 2, "policy": lambda profile, budget, link: 42,
                              "verbose": False})
    assert isinstance(result.error, PolicyError) and "returned int 42" in str(result.error)
    assert result.losses == [] and states_equal(state, _loop(0)[1])


def test_policy_none_profiles_and_says_so():
    result, _ = _loop(3, {"profile_iters": 2, "policy": None, "verbose": False})
    pooch = result.pooch
    assert pooch.plan is None and pooch.profile is not None
    assert any("policy None: profiled, no plan" in m for m in pooch.messages)


def test_a_block_without_a_plan_says_so_in_its_decision():
    """``decision()`` without a plan (policy None, a refusal) raised AttributeError."""
    result, _ = _loop(3, {"profile_iters": 2, "policy": None, "verbose": False})
    assert result.pooch.decision() == "no plan: policy=None profiles only"
    result, _ = _loop(3, {"profile_iters": 2, "budget": 1, "verbose": False})
    assert isinstance(result.error, BudgetTooSmallError)
    assert result.pooch.decision().startswith("no plan: ")


def test_a_pooch_runs_one_block_and_says_so_if_entered_again():
    """Entered again, a used PoocH ran every iteration on demand, never planned, saying
    nothing; it now refuses at once, and a new PoocH runs as usual."""
    result, _ = _loop(3, {"profile_iters": 2, "verbose": False})
    with pytest.raises(PoochError, match="make a new PoocH"):
        with result.pooch:
            pass
    assert result.pooch.plan is not None


@pytest.mark.parametrize("arguments,error", [
    ({"policy": 42}, TypeError), ({"split_convolutions": "no"}, ValueError)])
def test_arguments_of_the_wrong_kind_fail_when_pooch_is_made(arguments, error):
    """``policy=42`` failed only at the first classification, as "'int' object is not
    callable"; ``split_convolutions="no"`` was taken as true."""
    with pytest.raises(error, match=next(iter(arguments))):
        PoocH(BranchyNet(), **arguments)


@pytest.mark.parametrize("model,named", [
    (chainer.optimizers.SGD(), "SGD: pass the model it updates, optimizer.target"), (3, "int"),
    (np.zeros(3), "ndarray"), ([chainer.links.Linear(2, 2), 3], "int in the list")])
def test_an_object_that_is_no_link_is_named_when_pooch_is_made(model, named):
    """User trials: ``PoocH(optimizer)`` raised "'SGD' object is not iterable", and later
    named the optimizer with no word of its model; ``PoocH(array)`` named an element
    ("float64")."""
    with pytest.raises(TypeError, match=f"PoocH covers chainer Links .*; got {named}$"):
        PoocH(model)


@pytest.mark.parametrize("model", [None, [], ()])
def test_no_model_is_refused_when_pooch_is_made(model):
    """A user trial: ``PoocH(None)`` and ``PoocH([])`` trained on with no parameters,
    gradients or optimizer state counted against the budget and nothing to put back on a
    refusal."""
    with pytest.raises(TypeError, match="a chainer Link or a list of Links"):
        PoocH(model)


def test_a_users_policy_may_return_classes_only_pooch_simulates_them():
    """``classify(profile, budget, link) -> Plan`` that never called the simulator: PoocH
    schedules the classes itself, under its budget, and training stays bit-identical."""
    def every_other_map_swapped(profile, budget, link):
        tensors = profile.feature_maps.tensor
        return Plan("mine", {int(t): ("swap", "keep")[i % 2] for i, t in enumerate(tensors)})

    result, state = _loop(5, {"profile_iters": 2, "policy": every_other_map_swapped,
                              "verbose": False})
    assert result.error is None
    plan = result.pooch.plan
    assert plan.feasible and plan.policy == "mine" and len(plan.schedule)
    assert plan.counts["swap"] > 0 and plan.peak_bytes <= plan.budget_bytes
    assert list(result.pooch.iterations.program[2:]) == ["mine"] * 3
    assert states_equal(state, _loop(5)[1])


@pytest.mark.parametrize("iterations,said", [(3, True), (4, True), (5, False)])
def test_a_loop_that_ends_before_profiling_does_is_told_so(iterations, said):
    """A user trial: ``profile_iters=10`` over a 5-iteration loop said nothing, and no plan
    ever ran. At its end the block now says the loop ended before profiling did (also where
    the last iteration was the last profiled one: a plan made then never runs)."""
    result, state = _loop(iterations, {"profile_iters": 4, "verbose": False})
    assert result.error is None and states_equal(state, _loop(iterations)[1])
    told = [m for m in result.pooch.messages if "ended before profiling did" in m]
    assert bool(told) == said, result.pooch.messages
