"""Analytic profiles: real traced graphs, exact rescaling, the paper's memory figures."""
from __future__ import annotations


import numpy as np
import pytest

import pooch_ext  # noqa: F401
import chainer.functions as F
from chainer.function_hooks import TimerHook

from pooch_ext.analytic.tracing import (_trace_cached, analytic_profile, parse_size, profile_from_trace,
                                rescaled_trace, resolve_input_size, trace_model)
from pooch_ext.errors import UnknownNameError
from pooch_ext.models import MODEL_NAMES, get_model
from pooch_ext.profile import Profile
from pooch_ext.analytic.rescale import ShapeRuleError, rescale_trace

GB = 1e9


def test_size_parsing_and_errors():
    assert parse_size("3x16x112x112") == (3, 16, 112, 112)
    assert resolve_input_size("resnext101-3d", "16x64x64") == (3, 16, 64, 64)
    assert resolve_input_size("resnet50", (3, 96, 96)) == (3, 96, 96)
    assert resolve_input_size("resnet50", None) == (3, 224, 224)
    for bad in ("3x", "x3", "3x0x4", "", "3x-1", "axb"):
        with pytest.raises(ValueError, match="not a size"):
            parse_size(bad)
    with pytest.raises(ValueError, match="CxHxW or HxW"):
        resolve_input_size("resnet50", "3x16x112x112")
    with pytest.raises(ValueError, match="3 input channels"):
        resolve_input_size("resnet50", "1x224x224")
    with pytest.raises(ValueError, match="positive integer"):
        analytic_profile("small-resnet", 0)
    with pytest.raises(UnknownNameError):
        analytic_profile("small-resnet", 2, gpu="k80")
    with pytest.raises(UnknownNameError):
        analytic_profile("lenet", 2)


def _same_iteration(a: Profile, b: Profile) -> bool:
    """Equal up to the trace provenance in meta."""
    strip = lambda m: {k: v for k, v in m.items() if not k.startswith("trace_")}  # noqa: E731
    return Profile(a.ops, a.tensors, a.memory, a.resident_bytes, a.device, a.link,
                   strip(a.meta)) == Profile(b.ops, b.tensors, b.memory, b.resident_bytes,
                                             b.device, b.link, strip(b.meta))


@pytest.mark.slow
@pytest.mark.parametrize("name, small, large", [
    ("small-resnet", (2, (3, 32, 32)), (3, (3, 48, 40))),
    ("resnet50", (2, (3, 64, 64)), (3, (3, 96, 80))),
    ("resnext101-3d", (2, (3, 16, 32, 32)), (1, (3, 12, 40, 48))),
])
def test_rescaled_trace_equals_a_real_trace_at_that_size(name, small, large):
    batch, size = large
    traced_small = trace_model(name, *small)
    traced_large = trace_model(name, batch, size)       # really run at the large size
    rescaled = rescaled_trace(traced_small, batch, size)
    real = traced_large.trace
    assert [t.shape for t in rescaled.tensors] == [t.shape for t in real.tensors]
    assert [op.attrs for op in rescaled.ops] == [op.attrs for op in real.ops]
    assert rescaled.signature() == real.signature()
    assert _same_iteration(profile_from_trace(traced_small, batch, size),
                           profile_from_trace(traced_large, batch, size))


def test_rescale_refuses_what_it_cannot_do():
    traced = trace_model("small-resnet")
    with pytest.raises(ShapeRuleError, match="too small"):
        analytic_profile("alexnet", 2, (3, 8, 8))           # conv1 is 11x11, stride 4
    with pytest.raises(ShapeRuleError, match="input features"):
        analytic_profile("alexnet", 2, (3, 160, 160))
    trace = traced.trace
    broken = type(trace)(trace.tensors, list(trace.ops), trace.backward_order)
    broken.ops[2] = type(trace.ops[2])(**{**vars(trace.ops[2]), "name": "Elu"})
    with pytest.raises(ShapeRuleError, match="no shape rule for Chainer function 'Elu'"):
        rescale_trace(broken, {})
    with pytest.raises(ShapeRuleError, match="not network inputs"):
        rescale_trace(trace, {5: (1, 2)})


def test_resnet50_graph_has_the_functions_timerhook_sees():
    model = get_model("resnet50")
    rng = np.random.RandomState(0)
    x = rng.standard_normal((2, 3, 64, 64)).astype(np.float32)
    t = rng.randint(0, 1000, 2).astype(np.int32)
    with TimerHook() as timer:
        F.softmax_cross_entropy(model(x), t)
    trace = trace_model("resnet50").trace
    assert len(trace.ops) == len(timer.call_history) == 176
    assert [op.name for op in trace.ops] == [name for name, _ in timer.call_history]


def test_resnet50_memory_against_paper_figure_3():
    """Paper sec. 2.2 / 5.2: batch 256 exceeds the 16 GB V100; batch 640 needs about 50 GB."""
    at_256 = analytic_profile("resnet50", 256)
    at_640 = analytic_profile("resnet50", 640)
    assert at_256.incore_peak_bytes > 16 * GB and at_256.incore_peak_bytes > at_256.device.capacity_bytes
    assert 40 * GB <= at_640.incore_peak_bytes <= 65 * GB
    assert analytic_profile("resnet50", 192).incore_peak_bytes < at_256.device.capacity_bytes
    # feature maps scale exactly with the batch; parameters do not
    assert at_640.feature_map_bytes * 2 == analytic_profile("resnet50", 1280).feature_map_bytes
    assert at_256.resident_bytes == at_640.resident_bytes == 3 * trace_model("resnet50").param_bytes


def test_profile_contents_and_meta():
    p = analytic_profile("resnet50", 32, link="nvlink2")
    assert p.meta["model"] == "resnet50" and p.meta["batch"] == 32
    assert p.meta["input_size"] == [3, 224, 224] and p.meta["gpu"] == "v100-16gb"
    assert p.meta["source"] == "analytic" and p.link.name == "nvlink2"
    assert p.validate() == []
    assert len(p.forward_ops) == len(p.backward_ops) == 176
    assert (p.ops.duration_s > 0).all()
    conv = p.ops[(p.ops.phase == "forward") & (p.ops.name == "Convolution2DFunction")]
    assert (conv.transient_bytes > 0).all()
    first = p.tensors.set_index("tensor").loc[0]
    assert first["kind"] == "input" and first["shape"] == (32, 3, 224, 224)


@pytest.mark.slow
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_save_load_round_trip_every_model(name, tmp_path):
    small = {"alexnet": None, "vgg16": None, "resnext101-3d": (3, 8, 32, 32)}.get(name, (3, 32, 32))
    profile = analytic_profile(name, 2, small, gpu="h100", link="pcie4")
    assert Profile.load(profile.save(tmp_path / name)) == profile


def test_resnext3d_input_sweep_runs_without_materialising():
    """The paper's Figure 4 sweep (batch 1, memory up to ~58 GB) is only shape arithmetic."""
    trace_model("resnext101-3d")
    hits = _trace_cached.cache_info().hits
    peaks = [analytic_profile("resnext101-3d", 1, size).incore_peak_bytes
             for size in ((3, 16, 112, 112), (3, 64, 224, 224), (3, 128, 448, 448))]
    assert _trace_cached.cache_info().hits == hits + 3   # the one small trace, rescaled
    assert peaks[0] < peaks[1] < peaks[2] and peaks[2] > 16 * GB
