"""GraphRecorder sees what Chainer runs: op order, tensor ids, retention, backward order."""
from __future__ import annotations

import numpy as np

import pooch_ext  # noqa: F401
import chainer
import chainer.functions as F
import chainer.links as L
from chainer.function_hooks import TimerHook

from pooch_ext.hooks.graph import GraphRecorder
from pooch_ext.links import get_link
from pooch_ext.profile import Device


class Branchy(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(3, 8, 3, pad=1)
            self.bn = L.BatchNormalization(8)
            self.a = L.Convolution2D(8, 4, 1)
            self.b = L.Convolution2D(8, 4, 3, pad=1)
            self.fc = L.Linear(8, 5)

    def forward(self, x):
        h = F.relu(self.bn(self.conv(x)))
        m = F.concat([self.a(h), self.b(h)])
        h = F.dropout(m + h, 0.3)
        h = F.max_pooling_2d(h, 2)
        return self.fc(F.average_pooling_2d(h, 4))


def _step(model, x, t):
    loss = F.softmax_cross_entropy(model(x), t)
    model.cleargrads()
    loss.backward()
    return loss


def _data(batch=2):
    rng = np.random.RandomState(0)
    return rng.rand(batch, 3, 8, 8).astype("f"), rng.randint(0, 5, batch).astype("i")


def test_records_ops_tensors_and_retention():
    model, (x, t) = Branchy(), _data()
    with GraphRecorder(model) as rec:
        _step(model, x, t)
    trace = rec.traces[-1]
    names = [op.name for op in trace.ops]
    assert names == ["Convolution2DFunction", "BatchNormalization", "ReLU",
                     "Convolution2DFunction", "Convolution2DFunction", "Concat", "Add", "Dropout",
                     "MaxPoolingND", "AveragePooling2D", "Reshape", "LinearFunction",
                     "SoftmaxCrossEntropy"]
    conv, bn, relu = trace.ops[:3]
    assert conv.label == "conv" and bn.label == "bn" and trace.ops[11].label == "fc"
    assert conv.inputs == [0] and trace.tensors[0].producer == -1   # network input x
    assert [shape for shape, _ in conv.params] == [(8, 3, 3, 3), (8,)]
    assert conv.retain_inputs == [0] and relu.retain_outputs == [0] and relu.retain_inputs == []
    assert conv.attrs["ph"] == 1 and conv.attrs["sy"] == 1
    assert trace.tensors[relu.outputs[0]].shape == (2, 8, 8, 8)
    # backward visits every op once, the loss first and the stem conv last
    assert sorted(trace.backward_order) == list(range(13))
    assert trace.backward_order[0] == 12 and trace.backward_order[-1] == 0
    assert trace.loss == trace.ops[12].outputs[0]


def test_forward_op_count_matches_chainer_timer_hook():
    model, (x, t) = Branchy(), _data()
    with TimerHook() as timer:
        F.softmax_cross_entropy(model(x), t)
    with GraphRecorder(model) as rec:
        _step(model, x, t)
    assert len(rec.traces[-1].ops) == len(timer.call_history)


def test_iterations_are_split_and_stable():
    model, (x, t) = Branchy(), _data()
    with GraphRecorder(model) as rec:
        for _ in range(3):
            _step(model, x, t)
            with chainer.no_backprop_mode():   # evaluation in between is not recorded
                model(x)
    assert len(rec.traces) == 3
    assert rec.traces[0].signature() == rec.traces[1].signature() == rec.traces[2].signature()


def test_trace_builds_a_profile_with_the_same_tensor_ids():
    model, (x, t) = Branchy(), _data()
    with GraphRecorder(model) as rec:
        _step(model, x, t)
    trace = rec.traces[-1]
    builder = trace.to_builder(Device("cpu", 1 << 30), get_link("pcie3"),
                               lambda tr, op: {"duration_s": 1e-3, "backward_s": 2e-3})
    profile = builder.build(loss=trace.loss, backward_order=trace.backward_order)
    fmaps = set(profile.feature_maps.tensor)
    relu_out = trace.ops[2].outputs[0]
    bn_out = trace.ops[1].outputs[0]
    assert relu_out in fmaps and bn_out not in fmaps
    assert len(profile.backward_ops) == 13
    assert profile.tensors.set_index("tensor").kind[0] == "input"


class _CompletionRecorder(GraphRecorder):
    def __init__(self, model):
        super().__init__(model)
        self.completed_at = []

    def on_backward_complete(self, trace):
        self.completed_at.append(len(trace.backward_order))


def test_backward_completion_is_announced_before_the_update():
    model, (x, t) = Branchy(), _data()
    with _CompletionRecorder(model) as rec:
        for _ in range(2):
            _step(model, x, t)
            assert rec.completed_at[-1] == len(rec.trace.backward_order) == 13
    assert rec.completed_at == [13, 13]
