"""The promise, over a matrix of training situations x policies x budgets.

Training inside ``with PoocH(model, profile_iters=2, budget=..., policy=...)`` on the
host-simulated device must end with the same losses (and everything else the loop logs),
parameters, BatchNormalization running statistics and optimizer state as plain Chainer, bit
for bit, and with something swapped or recomputed when the budget is below the in-core need;
or PoocH refuses with a PoochError (BudgetTooSmallError where the budget is truly impossible
for the policy) raised out of the first iteration, before any optimizer update, with the
models exactly as they were before the ``with`` block. A crash, a silent difference, a refusal
of a budget the policy can meet, or a refusal after an update fails the test.

The situations (tests/promise_situations.py): recurrent nets (LSTM, NStepLSTM), an attention
block, a convolution zoo, optimizers with hooks and tied weights, loop variants (gradient
accumulation, two heads, Dropout, BatchNormalization in test mode, truncated BPTT), graph
changes (a short last batch, a branch, evaluation in between, a metric), a GAN (both models
wrapped, and the generator alone), DQN with a target network, a static graph, user code
reading intermediate Variables, two backward passes over one graph, double backprop.

Budgets come from a quick first run without a budget (``policy=None``, profiling only, which
must itself be plain Chainer bit for bit): ``floor`` = the largest ``minimum_budget`` and
``incore`` = the largest ``incore_peak_bytes`` among the profiles PoocH built for the loop's
graphs (a loop may have several: truncated BPTT's first segment, a short last batch, a
branch, test-mode iterations), and a budget ``fraction`` of the way between them. A refusal
is justified where the policy has no feasible plan at that budget on one of those profiles.
Where ``floor == incore`` (PoocH keeps every map in place, e.g. for a second backward pass)
the loop is run at the in-core need, and the outcome says so. Below-the-minimum budgets are
taken from the first graph's minimum, which PoocH checks before any update.

Outcomes ('identical', 'refused: <Error>', with notes) are counted in one line at the end of
the module; set PROMISE_MATRIX_REPORT=path to write every case's outcome to a file."""
from __future__ import annotations

import os

import pytest

from pooch_ext.errors import BudgetTooSmallError, PoochError
from pooch_ext.testing import states_equal

import promise_situations as ps

POLICIES = ["pooch", "swap-all", "sqrt-n", "superneurons"]
# (policy, fraction of the way from the minimum to the in-core need, slow?): two budgets for
# pooch, one for the others; sqrt-n and SuperNeurons keep or recompute more, so they get the
# looser one (at the tighter one most of them refuse, which the pooch cases already cover).
# The slow half: pooch's second budget (pooch classifies by search: the heaviest runs) and
# SuperNeurons. A ``lean`` situation (another's network in another loop, or one PoocH runs
# in-core only) skips pooch's second budget. (Every policy at both budgets for every situation
# took over a minute on two cores.)
GRID = [("pooch", 0.3, False), ("swap-all", 0.3, False), ("sqrt-n", 0.7, False),
        ("pooch", 0.7, True), ("superneurons", 0.7, True)]

_PLAIN: dict[tuple, ps.Outcome] = {}
_REFERENCE: dict[str, ps.Reference] = {}
OUTCOMES: dict[str, str] = {}


def _plain(situation: ps.Situation) -> ps.Outcome:
    key = (situation.build, situation.n_iters)   # the GAN's two wrappings share plain runs
    if key not in _PLAIN:
        _PLAIN[key] = ps.execute(situation, None)
    return _PLAIN[key]


def _reference(situation: ps.Situation) -> ps.Reference:
    if situation.name not in _REFERENCE:
        _REFERENCE[situation.name] = ps.reference(situation)
    return _REFERENCE[situation.name]


def _record(request, outcome: str) -> str:
    OUTCOMES[request.node.name] = outcome
    request.node.user_properties.append(("outcome", outcome))
    return outcome


@pytest.fixture(scope="module", autouse=True)
def _summary(request):
    yield
    if not OUTCOMES:
        return
    counts: dict[str, int] = {}
    for outcome in OUTCOMES.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    line = "promise matrix outcomes: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line("")
            reporter.write_line(line)
    path = os.environ.get("PROMISE_MATRIX_REPORT")
    if path:
        with open(path, "w") as out:
            out.write(line + "\n")
            for name, outcome in sorted(OUTCOMES.items()):
                out.write(f"{name}\t{outcome}\n")


def _ids(situations):
    return [s.name for s in situations]


# ---------------------------------------------------------------- budget None
@pytest.mark.parametrize("situation", ps.SITUATIONS, ids=_ids(ps.SITUATIONS))
def test_without_a_budget_training_is_plain_chainer(request, situation):
    """The reference run itself (no budget, profiling only) is plain Chainer, bit for bit."""
    ref = _reference(situation)
    outcome = ps.judge(situation, _plain(situation), ref.outcome, budget=None, incore=None,
                       refusal_justified=False)
    _record(request, outcome)
    if outcome == "identical":
        assert ref.profiles, "no profile after the profiled iterations"
        assert 0 < ref.floor <= ref.incore, (ref.floor, ref.incore)


# ---------------------------------------------------------------- the matrix
def _cases():
    for situation in ps.SITUATIONS:
        for policy, fraction, slow in GRID:
            if situation.lean and (policy, fraction) == ("pooch", 0.7):
                continue
            yield pytest.param(situation, policy, fraction,
                               marks=(pytest.mark.slow,) if slow else (),
                               id=f"{situation.name}-{policy}-{int(fraction * 100)}")


@pytest.mark.parametrize("situation,policy,fraction", list(_cases()))
def test_bit_identical_or_clean_refusal(request, situation, policy, fraction):
    ref = _reference(situation)
    plain = _plain(situation)
    kwargs = {"profile_iters": ps.PROFILE_ITERS, "policy": policy, "verbose": False}
    if ref.profile is None:
        # only a loop PoocH may decline as a whole gets here without a failure: it must decline
        # (or train exactly) under every policy too
        assert situation.may_refuse, (
            f"the reference run (no budget) gave no profile: {ref.outcome.describe_error()}")
        run = ps.execute(situation, dict(kwargs, budget=None))
        _record(request, ps.judge(situation, plain, run, budget=None, incore=None,
                                  refusal_justified=False))
        return
    if ref.in_core_only:
        # PoocH measured every map as needed in place (held by the caller or a later backward
        # pass): no budget below the in-core need is possible, so the loop must run exactly
        # at that need
        run = ps.execute(situation, dict(kwargs, budget=ref.incore))
        outcome = ps.judge(situation, plain, run, budget=ref.incore, incore=ref.incore,
                           refusal_justified=not ref.policy_fits(policy, ref.incore))
        _record(request, f"{outcome} (in-core only: minimum == in-core need)")
        return
    budget = ref.budget(fraction)
    assert ref.floor <= budget < ref.incore
    run = ps.execute(situation, dict(kwargs, budget=budget))
    _record(request, ps.judge(situation, plain, run, budget=budget, incore=ref.incore,
                              refusal_justified=not ref.policy_fits(policy, budget)))


# ---------------------------------------------------------------- below the minimum
def _refused_cleanly(situation: ps.Situation, run: ps.Outcome, budget: int,
                     any_pooch_error: bool = False) -> str:
    assert not run.leaks, f"PoocH left global state behind: {run.leaks}"
    expected = PoochError if any_pooch_error else BudgetTooSmallError
    assert isinstance(run.error, expected), (
        f"a budget below the minimum must raise {expected.__name__}; got {run.describe_error()}")
    assert run.error_iteration in ((-1, 0) if any_pooch_error else (0,)), \
        f"not out of the first iteration: {run.describe_error()}"
    assert run.values == [], "raised after the first iteration finished"
    assert states_equal(run.state, run.initial), "the failed attempt changed the models"
    if isinstance(run.error, BudgetTooSmallError):
        assert run.error.budget_bytes == budget and run.error.minimum_bytes > budget, \
            (run.error.budget_bytes, run.error.minimum_bytes, budget)
    return f"refused: {type(run.error).__name__}"


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("how", ["floor-1", "half-floor"])
def test_a_layer_larger_than_the_budget_is_refused_before_any_update(request, policy, how):
    situation = ps.BIG_LAYER
    ref = _reference(situation)
    assert ref.profile is not None, ref.outcome.describe_error()
    budget = ref.first_floor - 1 if how == "floor-1" else ref.first_floor // 2
    run = ps.execute(situation, {"profile_iters": ps.PROFILE_ITERS, "policy": policy,
                                 "budget": budget, "verbose": False})
    _record(request, _refused_cleanly(situation, run, budget))


@pytest.mark.parametrize("situation", ps.SITUATIONS, ids=_ids(ps.SITUATIONS))
def test_every_situation_refuses_a_budget_below_the_minimum_before_any_update(request,
                                                                              situation):
    ref = _reference(situation)
    declined = ref.profile is None
    if declined:
        # a loop PoocH declines as a whole: any clean PoochError will do, at any budget
        assert situation.may_refuse, (
            f"the reference run (no budget) gave no profile: {ref.outcome.describe_error()}")
    budget = 1 if declined else ref.first_floor // 2
    run = ps.execute(situation, {"profile_iters": ps.PROFILE_ITERS, "policy": "pooch",
                                 "budget": budget, "verbose": False})
    _record(request, _refused_cleanly(situation, run, budget, any_pooch_error=declined))
