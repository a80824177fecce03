"""Analytic profiles: the real Chainer graph, traced on CPU, charged with the cost model.

``analytic_profile("resnet50", 640)`` runs the real network once (forward + backward) on CPU
at a tiny batch and, where the real size would be too slow on a CPU, a reduced spatial size
(``TRACE_SPECS``), under ``GraphRecorder``; the graph, what each function retains and the
order backward visits the functions are therefore Chainer's own. ``analytic/rescale.py``
then re-derives every tensor shape for the requested batch and input size from per-function
shape rules, ``analytic/costmodel.py`` charges each op on the named GPU, and ``ProfileBuilder``
fixes the in-core memory events. Traces are cached in-process, so sweeps over batch or input size
trace each network once and never materialise the large sizes.
"""
from __future__ import annotations

import functools
import re
import warnings
from dataclasses import dataclass

import numpy as np

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer
import chainer.functions as F

from pooch_ext.analytic.costmodel import (GPU, OpShapes, check_conv_impl, get_gpu, op_times,
                                 resident_bytes, update_time_s)
from pooch_ext.analytic.splits import conv_configs
from pooch_ext.functions import op_cost
from pooch_ext.hooks.graph import GraphRecorder
from pooch_ext.trace import GraphTrace, OpRecord
from pooch_ext.links import Link, get_link
from pooch_ext.models import default_input_size, get_model
from pooch_ext.profile import Device, Profile
from pooch_ext.analytic.rescale import rescale_trace

# model -> (trace batch, trace input size): small enough to run forward + backward on a CPU
# in well under a second or two; networks with fixed-size classifiers keep their input size.
TRACE_SPECS: dict[str, tuple[int, tuple[int, ...]]] = {
    "resnet50": (2, (3, 64, 64)),
    "alexnet": (1, (3, 227, 227)),
    "resnext101-3d": (2, (3, 16, 32, 32)),
    "vgg16": (1, (3, 224, 224)),
    "small-resnet": (2, (3, 32, 32)),
}
OPTIMIZER = "momentum_sgd"
_SIZE = re.compile(r"^\s*[0-9]+(\s*[xX]\s*[0-9]+)*\s*$")   # ASCII digits only
MAX_SIZE_PART = 1 << 20                 # a batch or one input dimension


def parse_size(text: str) -> tuple[int, ...]:
    """'3x16x112x112' -> (3, 16, 112, 112); every part an integer in 1..MAX_SIZE_PART."""
    if not isinstance(text, str) or not _SIZE.match(text):
        raise ValueError(f"not a size: {text!r} (expected positive integers joined by 'x', "
                         "e.g. 3x224x224 or 16x112x112)")
    parts = tuple(int(p) for p in re.split(r"\s*[xX]\s*", text.strip()))
    if any(not 1 <= p <= MAX_SIZE_PART for p in parts):
        raise ValueError(f"not a size: {text!r} (every part must be in 1..{MAX_SIZE_PART})")
    return parts


def resolve_input_size(model: str, size: str | tuple[int, ...] | None) -> tuple[int, ...]:
    """The per-sample input shape for ``model``: its default, a full shape (C,H,W / C,T,H,W)
    or the shape without channels (H,W / T,H,W), which keep the model's channel count."""
    default = default_input_size(model)
    if size is None:
        return default
    shape = parse_size(size) if isinstance(size, str) else tuple(int(s) for s in size)
    if any(not 1 <= s <= MAX_SIZE_PART for s in shape):
        raise ValueError(f"input size {shape}: every part must be in 1..{MAX_SIZE_PART}")
    if len(shape) == len(default) - 1:
        shape = default[:1] + shape
    if len(shape) != len(default):
        names = "CxTxHxW or TxHxW" if len(default) == 4 else "CxHxW or HxW"
        raise ValueError(f"{model} takes an input size {names} (e.g. "
                         f"{'x'.join(map(str, default))}), got {'x'.join(map(str, shape))}")
    if shape[0] != default[0]:
        raise ValueError(f"{model} takes {default[0]} input channels, got {shape[0]}")
    return shape


@dataclass(frozen=True)
class ModelTrace:
    """One traced iteration of a network and what the cost model needs of its parameters."""

    model: str
    batch: int
    input_size: tuple[int, ...]
    trace: GraphTrace
    param_bytes: int
    n_param_arrays: int


def trace_model(model: str, batch: int | None = None,
                input_size: tuple[int, ...] | None = None) -> ModelTrace:
    """Run ``model`` forward + backward once on CPU under GraphRecorder (cached in-process).

    Defaults are the model's ``TRACE_SPECS`` entry."""
    spec_batch, spec_size = TRACE_SPECS.get(model, (2, None))
    size = resolve_input_size(model, input_size if input_size is not None else spec_size)
    return _trace_cached(model, int(batch or spec_batch), size)


@functools.lru_cache(maxsize=32)
def _trace_cached(model: str, batch: int, input_size: tuple[int, ...]) -> ModelTrace:
    return trace_network(get_model(model), batch, input_size, model)


def trace_network(net: chainer.Link, batch: int, input_size: tuple[int, ...],
                  name: str) -> ModelTrace:
    """Trace any classifier ``net`` (x -> logits) once on CPU at ``batch`` x ``input_size``;
    ``profile_from_trace`` then gives its analytic profile at any batch (not cached)."""
    rng = np.random.RandomState(0)
    x = rng.standard_normal((batch,) + input_size).astype(np.float32)
    t = rng.randint(0, 2, size=batch).astype(np.int32)
    with warnings.catch_warnings(), chainer.using_config("train", True):
        warnings.simplefilter("ignore")   # BN warns about 1-element statistics at tiny sizes
        with GraphRecorder(net) as recorder:
            loss = F.softmax_cross_entropy(net(x), t)
            net.cleargrads()
            loss.backward()
    params = list(net.params())
    return ModelTrace(name, batch, tuple(input_size), recorder.traces[-1],
                      int(sum(p.array.nbytes for p in params)), len(params))


def _op_shapes(trace: GraphTrace, op: OpRecord, conv: str) -> OpShapes:
    tensors = trace.tensors
    first = tensors[op.inputs[0]] if op.inputs else None
    itemsize = np.dtype(first.dtype).itemsize if first is not None and first.dtype else 4
    return OpShapes(op.name, [tensors[t].shape for t in op.inputs],
                    [tensors[t].shape for t in op.outputs], [shape for shape, _ in op.params],
                    dict(op.attrs), list(op.differentiable), itemsize, conv)


def _cost_function(gpu: GPU, conv: str):
    def cost(trace: GraphTrace, op: OpRecord) -> dict:
        shapes = _op_shapes(trace, op, conv)
        c = op_cost(shapes)
        forward_s, backward_s = op_times(gpu, c)
        configs, backward_configs = conv_configs(shapes, c, gpu)
        return dict(duration_s=forward_s, backward_s=backward_s,
                    configs=configs, backward_configs=backward_configs,
                    transient_bytes=c.transient_bytes,
                    backward_transient_bytes=c.backward_transient_bytes,
                    saved_bytes=c.saved_bytes)
    return cost


def rescaled_trace(traced: ModelTrace, batch: int, input_size: tuple[int, ...]) -> GraphTrace:
    """``traced`` at another batch and per-sample input size (shape rules, nothing run)."""
    new_shapes = {}
    for record in traced.trace.tensors:
        if record.producer >= 0:
            continue
        if record.shape == (traced.batch,) + traced.input_size:
            new_shapes[record.tid] = (batch,) + tuple(input_size)
        elif record.shape == (traced.batch,):
            new_shapes[record.tid] = (batch,)
        else:
            raise ValueError(f"{traced.model}: network input {record.tid} of shape "
                             f"{record.shape} is neither the data nor the labels")
    return rescale_trace(traced.trace, new_shapes)


def profile_from_trace(traced: ModelTrace, batch: int, input_size: tuple[int, ...],
                       gpu: str | GPU = "v100-16gb", link: str | Link = "pcie3",
                       conv: str = "im2col") -> Profile:
    """The analytic Profile of ``traced`` rescaled to ``batch`` x ``input_size``."""
    gpu, link = get_gpu(gpu), get_link(link)
    check_conv_impl(conv)
    trace = rescaled_trace(traced, batch, input_size)
    meta = {"model": traced.model, "batch": int(batch), "input_size": list(input_size),
            "gpu": gpu.name, "source": "analytic", "optimizer": OPTIMIZER, "conv": conv,
            "trace_batch": traced.batch, "trace_input_size": list(traced.input_size)}
    builder = trace.to_builder(Device(gpu.name, gpu.capacity_bytes, "analytic"), link,
                               _cost_function(gpu, conv), meta)
    builder.resident(resident_bytes(traced.param_bytes, OPTIMIZER))
    return builder.build(loss=trace.loss, backward_order=trace.backward_order,
                         update_s=update_time_s(gpu, traced.param_bytes, traced.n_param_arrays,
                                                OPTIMIZER))


def analytic_profile(model: str, batch: int, input_size: tuple | str | None = None,
                     gpu: str = "v100-16gb", link: str = "pcie3", conv: str = "im2col") -> Profile:
    """One training iteration of ``model`` at ``batch`` on the cost model's ``gpu``.

    ``input_size`` is per sample ((C,H,W) or (C,T,H,W), or without C; a string like
    '3x16x112x112' works too); default the model's own. meta holds model, batch,
    input_size, gpu, source='analytic'. ``conv`` picks how convolutions are charged:
    "im2col" (CuPy without cuDNN, what our executor runs) or "cudnn" (the paper's setup).
    """
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) \
            or not 1 <= batch <= MAX_SIZE_PART:
        raise ValueError(f"batch must be a positive integer up to {MAX_SIZE_PART}, got {batch!r}")
    size = resolve_input_size(model, input_size)
    get_gpu(gpu), get_link(link), check_conv_impl(conv)   # name errors before the trace
    return profile_from_trace(trace_model(model), int(batch), size, gpu, link, conv)
