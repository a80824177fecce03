"""Gist's in-place ReLU (issue 16): which ReLUs may write over their input (graph and array
checks), how the planner sees it, and training with it: bit-identical, within the budget,
and a deviation (never a clobbered array) where the caller keeps a reference after all."""
from __future__ import annotations

import numpy as np
import pytest

import chainer
import chainer.functions as F
import chainer.links as L

from pooch_ext import encodings, inplace
from pooch_ext.analytic.tracing import analytic_profile, profile_from_trace, trace_network
from pooch_ext.errors import BudgetTooSmallError, PoochError
from pooch_ext.hooks.cpu_device import CpuDevice
from pooch_ext.policies import get_policy
from pooch_ext.hooks.inplace_relu import alone, as_chainer, write_over_input
from pooch_ext.sim.budgets import budget_between
from pooch_ext.testing import ConvNet, states_equal, synthetic_batches, trained


# ---------------------------------------------------------------- the array check

def _alone_at_relu(make_input) -> bool:
    """``alone`` as the executor calls it, on the ReLU of ``make_input()``."""
    seen = []

    class Probe(chainer.FunctionHook):
        name = "test_alone"

        def forward_preprocess(self, function, in_data):
            if type(function).__name__ == "ReLU":
                seen.append(alone(in_data))

    with Probe():
        F.relu(make_input())
    return seen[0]


def test_only_an_array_nothing_else_refers_to_may_be_written_over():
    conv = L.Convolution2D(3, 4, 3, pad=1)
    x = np.random.default_rng(0).standard_normal((2, 3, 6, 6)).astype(np.float32)
    kept = {}

    def keep_array():
        h = conv(x)
        kept["array"] = h.array                  # the caller keeps the array itself
        return h

    def keep_a_view():
        h = conv(x)
        kept["view"] = h.array[0]                # a view of it
        return h

    def share_with_a_living_variable():
        h = conv(x)
        kept["variable"] = h                     # h lives on, its array shared
        return F.identity(h)

    assert _alone_at_relu(lambda: conv(x))                          # a temporary
    assert _alone_at_relu(lambda: F.transpose(conv(x)))             # one view of all of it
    assert not _alone_at_relu(keep_array)
    assert not _alone_at_relu(keep_a_view)
    assert not _alone_at_relu(share_with_a_living_variable)         # two Variables, one array
    assert not _alone_at_relu(lambda: conv(x)[:, :2])               # a view of part of it
    assert not _alone_at_relu(lambda: chainer.Variable(x))          # the caller's own array


def relu_with_and_without_writing_over(xp) -> tuple:
    """(y and x.grad bytes of Chainer's ReLU, the same with the ReLU writing over its input)
    for inputs and gradients that hold every special value."""
    from tests.test_encodings import special_values
    x, gy = special_values()
    results = []
    for over in (False, True):
        v = chainer.Variable(xp.asarray(x))
        inputs: list = []

        class Over(chainer.FunctionHook):
            name = "test_over"

            def forward_preprocess(self, function, in_data):
                if over and type(function).__name__ == "ReLU":   # noqa: B023 - run at once
                    write_over_input(function)
                    inputs.append(in_data[0])                      # noqa: B023

            def forward_postprocess(self, function, in_data):
                as_chainer(function)

        with Over():
            y = F.relu(v * 1)            # its input a temporary it may write over
        # written over its input, or not at all
        assert (len(inputs) == 1 and y.array is inputs[0]) if over else not inputs
        inputs.clear()
        y.grad = xp.asarray(gy)
        y.backward()
        results.append(tuple(chainer.backends.cuda.to_cpu(a).tobytes() for a in (y.array, v.grad)))
    return tuple(results)


def test_writing_over_the_input_gives_chainers_bits():
    plain, over = relu_with_and_without_writing_over(np)
    assert plain == over


# ---------------------------------------------------------------- the planner's view

class Held(chainer.Chain):
    """ReLUs whose input: a temporary (in place), kept by the caller, read again after."""

    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.c1 = L.Convolution2D(3, 8, 3, pad=1)
            self.c2 = L.Convolution2D(8, 8, 3, pad=1)
            self.c3 = L.Convolution2D(8, 8, 3, pad=1)
            self.fc = L.Linear(None, 5)

    def forward(self, x):
        h = F.relu(self.c1(x))                 # in place
        a = self.c2(h)
        h = F.relu(a)                          # a lives on in the caller: not in place
        b = self.c3(h)
        h = F.relu(b) + b                      # b read after the ReLU: not in place
        del a
        return self.fc(h)


def test_the_rule_takes_only_relus_whose_input_nothing_reads_or_holds_after():
    profile = profile_from_trace(trace_network(Held(), 4, (3, 8, 8), "held"), 4, (3, 8, 8))
    ops = inplace.inplace_ops(profile)
    relus = profile.ops[(profile.ops.name == "ReLU") & (profile.ops.phase == "forward")]
    assert ops == [int(relus.op.iloc[0])]
    rewritten = inplace.inplace_profile(profile, ops)
    assert inplace.inplace_of(rewritten) == ops
    assert rewritten.incore_peak_bytes <= profile.incore_peak_bytes
    rewritten.check()
    memory = rewritten.memory[rewritten.memory.op == ops[0]]
    x = int(profile.ops.at[ops[0], "inputs"][0])
    assert memory.iloc[0].kind == "free" and memory.iloc[0].tensor == x   # before the output
    with pytest.raises(PoochError, match=f"op {int(relus.op.iloc[1])} \\(ReLU\\) cannot write"):
        inplace.inplace_profile(profile, [int(relus.op.iloc[1])])
    with pytest.raises(PoochError, match="op 999 is not a forward op of this profile"):
        inplace.inplace_profile(profile, [999])


@pytest.fixture(scope="module")
def vgg_small():
    return analytic_profile("vgg16", batch=16, conv="cudnn")


def test_in_place_relus_lower_vgg16s_footprint_beside_the_encodings():
    vgg = analytic_profile("vgg16", batch=256, conv="cudnn")
    ops = inplace.inplace_ops(vgg)
    assert len(ops) == 15                              # every ReLU of VGG-16
    base = encodings.lossless_base(vgg)
    encoded = encodings.encoded_profile(vgg, encodings.candidates(vgg, "lossless"))
    both = encodings.encoded_profile(base, encodings.candidates(base, "lossless"))
    assert both.incore_peak_bytes < encoded.incore_peak_bytes
    assert encodings.footprint(vgg, "lossless") == (vgg.incore_peak_bytes,
                                                     both.incore_peak_bytes)


def test_a_budget_only_the_lossless_profile_fits_gets_its_plan_not_a_refusal(vgg_small):
    """classify_one refusing the plain profile (its minimum budget is above the budget, say)
    leaves the encoded and in-place profiles to try; refused everywhere, the plain
    profile's refusal is raised."""
    pooch = get_policy("pooch").classify

    def refuses_plain(target, **kwargs):
        if target is vgg_small:
            raise BudgetTooSmallError(kwargs["budget"], kwargs["budget"] + 1, "plain")
        return pooch(target, **kwargs)

    budget = budget_between(vgg_small, 0.2)
    target, plan = encodings.classify(vgg_small, refuses_plain, "lossless", budget=budget,
                                      link="pcie3")
    assert target is not vgg_small and plan.feasible and plan.inplace

    def refuses_all(target, **kwargs):
        raise BudgetTooSmallError(kwargs["budget"], kwargs["budget"] + 1,
                                  "plain" if target is vgg_small else "other")

    with pytest.raises(BudgetTooSmallError, match="for plain"):
        encodings.classify(vgg_small, refuses_all, "lossless", budget=budget, link="pcie3")


# ---------------------------------------------------------------- training

def _runs(net, batches, between=lambda: None, **pooch):
    """A roomy run for the profile, then (after ``between()``) one at the smallest budget
    with lossless encodings and in-place ReLUs."""
    roomy, _ = trained(net, batches, dict(profile_iters=2, verbose=False, device=CpuDevice(),
                                          encodings="lossless"))
    between()
    budget = budget_between(encodings.lossless_base(roomy.pooch.profile), 0.002)
    return trained(net, batches, dict(profile_iters=2, verbose=False, device=CpuDevice(),
                                      encodings="lossless", link="cpu", budget=budget, **pooch))


def test_training_with_in_place_relus_is_bit_identical_and_within_budget():
    batches = synthetic_batches(5, 16, (3, 32, 32), 5)
    _, plain = trained(ConvNet, batches)
    result, state = _runs(ConvNet, batches)
    assert states_equal(plain, state)
    runtime = result.pooch
    assert runtime.plan.inplace
    planned = runtime.runtime.history[2:]
    assert all(h.inplace == len(runtime.plan.inplace) and not h.deviation for h in planned)
    assert all(h.peak_bytes <= runtime.budget_bytes for h in planned)


class Peeks(ConvNet):
    """ConvNet whose caller, from the fourth iteration on, keeps the first convolution's
    output array (to log it, say) across its ReLU: by then the plan writes over it."""

    iteration = 0
    seen: list = []

    def forward(self, x):
        Peeks.iteration += 1
        a = self.c1(x)
        kept = a.array if Peeks.iteration >= 4 else None
        h = F.relu(a)
        del a
        if kept is not None:
            Peeks.seen.append(bool((kept < 0).any()))   # still the convolution's output
        h = F.relu(self.c2(h))
        h = F.max_pooling_2d(h, 2)
        return self.fc(F.relu(self.c3(h)))


def test_a_reference_the_profile_never_saw_stops_the_plan_and_nothing_is_written_over():
    batches = synthetic_batches(6, 16, (3, 32, 32), 5)
    Peeks.iteration, Peeks.seen = 0, []
    _, plain = trained(Peeks, batches)
    assert Peeks.seen == [True] * 3

    def start_over():
        Peeks.iteration, Peeks.seen = 0, []

    result, state = _runs(Peeks, batches, start_over)
    assert states_equal(plain, state)
    assert Peeks.seen == [True] * 3            # the kept array was never written over
    runtime = result.pooch
    assert 1 in runtime.plan.inplace or any(h.deviation for h in runtime.runtime.history)
    assert any("write over its input" in h.deviation for h in runtime.runtime.history)
