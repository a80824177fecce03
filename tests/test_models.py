"""The networks: real Chainer links, right output shapes, trainable."""
from __future__ import annotations

import numpy as np
import pytest

import pooch_ext  # noqa: F401
import chainer
import chainer.functions as F

from pooch_ext.analytic.tracing import trace_model
from pooch_ext.errors import UnknownNameError
from pooch_ext.models import MODEL_NAMES, default_input_size, get_model


def _batch(shape, n_classes, batch=2, seed=0):
    rng = np.random.RandomState(seed)
    return (rng.standard_normal((batch,) + shape).astype(np.float32),
            rng.randint(0, n_classes, batch).astype(np.int32))


def test_registry():
    assert set(MODEL_NAMES) == {"resnet50", "alexnet", "resnext101-3d", "vgg16", "small-resnet",
                                "resnet18"}
    assert default_input_size("resnext101-3d") == (3, 16, 112, 112)
    assert default_input_size("resnet50") == (3, 224, 224)
    with pytest.raises(UnknownNameError, match="known: resnet50"):
        get_model("resnet-50")
    with pytest.raises(ValueError):
        get_model("small-resnet", n_classes=0)


@pytest.mark.slow
@pytest.mark.parametrize("name, size, classes", [
    ("small-resnet", (3, 32, 32), 10),
    ("resnet50", (3, 64, 64), 1000),          # global pooling: any input size runs
    ("resnet18", (3, 64, 64), 1000),
    ("resnext101-3d", (3, 16, 32, 32), 400),
])
def test_one_training_step_changes_parameters(name, size, classes):
    model = get_model(name)
    x, t = _batch(size, classes)
    before = {path: p.array.copy() for path, p in model.namedparams()}
    optimizer = chainer.optimizers.MomentumSGD(lr=0.01)
    optimizer.setup(model)
    y = model(x)
    assert y.shape == (2, classes)
    loss = F.softmax_cross_entropy(y, t)
    model.cleargrads()
    loss.backward()
    optimizer.update()
    changed = [path for path, p in model.namedparams() if not np.array_equal(before[path], p.array)]
    assert len(changed) == len(before)        # every parameter got a gradient step
    assert np.isfinite(float(loss.array))


def test_small_resnet_has_the_structures_the_executor_needs():
    trace = trace_model("small-resnet").trace
    names = {op.name for op in trace.ops}
    assert {"Convolution2DFunction", "BatchNormalization", "ReLU", "MaxPoolingND", "Concat",
            "Add", "AveragePooling2D", "Dropout", "LinearFunction"} <= names
    assert sum(op.name == "Add" for op in trace.ops) == 4   # two stage-1 blocks, concat mix, stage 2
    model = get_model("small-resnet", n_classes=7)
    assert model(_batch((3, 32, 32), 7)[0]).shape == (2, 7)


@pytest.mark.slow   # builds AlexNet and VGG-16 (138M parameters) once; later tests reuse the trace
@pytest.mark.parametrize("name, params", [
    ("resnet50", 25_557_096),       # Chainer example ResNet-50 (conv1 has a bias)
    ("resnet18", 11_689_512),       # torchvision's
    ("alexnet", 62_378_344),
    ("vgg16", 138_357_544),
])
def test_parameter_counts_match_the_originals(name, params):
    traced = trace_model(name)          # the real network, run once (cached for other tests)
    assert traced.param_bytes == 4 * params


def test_fixed_size_networks_output_logits():
    for name in ("alexnet", "vgg16"):
        traced = trace_model(name)
        logits = traced.trace.tensors[traced.trace.ops[-1].inputs[0]]
        assert logits.shape == (traced.batch, 1000)
        assert traced.input_size == default_input_size(name)


def test_resnext101_3d_structure():
    trace = trace_model("resnext101-3d").trace
    convs = [op for op in trace.ops if op.name == "ConvolutionND"]
    grouped = [op for op in convs if op.attrs["groups"] == 32]
    assert len(grouped) == 3 + 4 + 23 + 3          # one grouped 3x3x3 conv per block
    assert convs[0].attrs["stride"] == (1, 2, 2) and convs[0].params[0][0] == (64, 3, 7, 7, 7)
    assert trace.tensors[trace.ops[-2].outputs[0]].shape[1] == 400   # Kinetics classes
