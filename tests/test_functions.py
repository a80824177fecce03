"""The per-function table (pooch_ext.functions): every Chainer function the example networks
use has a shape rule, a cost rule and a recompute rule or the reason it has none, and the
shape rules predict what Chainer really makes at another batch size."""
from __future__ import annotations

import math

import numpy as np
import pytest

from pooch_ext.analytic.tracing import trace_model, trace_network
from pooch_ext.analytic.costmodel import OpShapes
from pooch_ext.functions import FUNCTIONS, RECOMPUTABLE, Function, op_cost, recompute_refusal
from pooch_ext.hooks.graph import GraphRecorder
from pooch_ext.hooks.recompute import RULES
from pooch_ext.testing import BranchyNet, UnrolledLSTM
from pooch_ext.models import get_model
from pooch_ext.analytic.rescale import ShapeRuleError, rescale_trace
from pooch_ext.analytic.shapes import same_as_first

# every example network, at a small size: (make, trace(net, batch) -> GraphTrace)
IMAGE_NETS = {"small-resnet": (3, 32, 32), "resnet50": (3, 64, 64), "alexnet": (3, 227, 227),
              "vgg16": (3, 224, 224), "resnext101-3d": (3, 16, 32, 32)}


def _image_trace(name, batch):
    make = (lambda: BranchyNet()) if name == "branchy" else (lambda: get_model(name))
    size = (3, 16, 16) if name == "branchy" else IMAGE_NETS[name]
    np.random.seed(0)
    return trace_network(make(), batch, size, name).trace


def _lstm_trace(batch):
    import chainer
    import chainer.functions as F

    np.random.seed(0)
    net = UnrolledLSTM(vocab=20, width=8, classes=3)
    x = np.random.randint(0, 20, (batch, 4)).astype(np.int32)
    t = np.random.randint(0, 3, batch).astype(np.int32)
    with chainer.using_config("train", True), GraphRecorder(net) as recorder:
        F.softmax_cross_entropy(net(x), t).backward()
    return recorder.traces[-1]


def _trace(name, batch):
    return _lstm_trace(batch) if name == "lstm" else _image_trace(name, batch)


NETWORKS = ["small-resnet", "branchy", "lstm", "resnet50", "alexnet", "vgg16", "resnext101-3d"]
TRACED_TWICE = {"small-resnet", "branchy", "lstm", "resnet50"}   # the others take seconds


@pytest.fixture(scope="module", params=NETWORKS)
def traced(request):
    """(name, trace at a small batch, trace at twice that batch or None)."""
    name = request.param
    if name not in TRACED_TWICE:
        return name, trace_model(name).trace, None     # cached: other tests trace it too
    return name, _trace(name, 2), _trace(name, 4)


@pytest.mark.slow
def test_every_function_of_the_example_networks_has_all_its_rules(traced):
    name, trace, _ = traced
    used = {op.name for op in trace.ops}
    assert used <= set(FUNCTIONS), f"{name}: no entry for {sorted(used - set(FUNCTIONS))}"
    for op in trace.ops:
        entry = FUNCTIONS[op.name]
        assert bool(entry.recompute) != bool(entry.not_recomputable)
        assert (op.name in RECOMPUTABLE) == (op.name in RULES)     # the executor can run it
        shapes = [trace.tensors[t].shape for t in op.inputs]
        cost = op_cost(OpShapes(op.name, shapes, [trace.tensors[t].shape for t in op.outputs],
                                [shape for shape, _ in op.params], dict(op.attrs),
                                list(op.differentiable)))
        figures = [cost.fwd_flops, cost.fwd_bytes, cost.bwd_flops, cost.bwd_bytes]
        assert all(math.isfinite(v) and v >= 0 for v in figures), (name, op.name, cost)
        assert cost.fwd_bytes > 0 or op.name == "Reshape", (name, op.name)


def test_shape_rules_predict_the_graph_chainer_makes_at_twice_the_batch(traced):
    name, trace, doubled = traced
    inputs = {r.tid: (2 * r.shape[0],) + tuple(r.shape[1:])
              for r in trace.tensors if r.producer < 0 and r.shape}
    rescaled = rescale_trace(trace, inputs)   # replays the rules at the recorded size first
    if doubled is None:
        return
    assert [r.shape for r in rescaled.tensors] == [r.shape for r in doubled.tensors], name
    assert [op.attrs for op in rescaled.ops] == [op.attrs for op in doubled.ops], name


def test_a_function_is_recomputable_or_says_why_not():
    with pytest.raises(ValueError):
        Function(same_as_first, op_cost)
    with pytest.raises(ValueError):
        Function(same_as_first, op_cost, "forward", not_recomputable="both")
    assert recompute_refusal("ReLU") == ""
    assert "LSTM" in recompute_refusal("LSTM") and "two outputs" in recompute_refusal("LSTM")
    assert "no exact recompute rule" in recompute_refusal("Elu")


def test_a_function_without_an_entry_is_refused_by_name():
    trace = _lstm_trace(2)
    trace.ops[0].name = "MadeUp"
    with pytest.raises(ShapeRuleError, match="no shape rule for Chainer function 'MadeUp'"):
        rescale_trace(trace, {r.tid: r.shape for r in trace.tensors if r.producer < 0})
