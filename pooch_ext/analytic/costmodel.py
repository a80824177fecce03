"""Analytic cost of one Chainer function on a named GPU (profiles without a GPU).

The cost rules are here; which function uses which is ``pooch_ext.functions.FUNCTIONS``
(``functions.op_cost`` looks one up).

Each op is charged ``max(flops / achieved FLOP/s, bytes / achieved bandwidth) + launch
latency`` for its forward and for its backward, where the FLOPs and the bytes moved follow
what Chainer 7.8.1 + CuPy do **without cuDNN** (the way our executor runs): a convolution is
im2col + GEMM, batch normalisation, pooling, dropout are CuPy elementwise / reduction kernels.
The same rules give the memory an op needs besides its inputs and outputs:

* transient bytes, allocated and freed inside the op. Convolution (2D and ND, grouped or
  not): the im2col column buffer ``N*C*prod(k)*prod(out)``; with a batch above 1 CuPy's
  tensordot / matmul copies it once more into GEMM layout (the moved (C,k..,N,out..) view
  cannot be reshaped in place), and ``Convolution2DFunction.forward_gpu`` allocates an
  output-sized array it does not use on the im2col path. Backward: the weight gradient
  rebuilds the column buffer (and its copy) plus a copy of gy, the data gradient a column
  buffer (gcol) of the same size; they run one after the other, so the larger one counts.
  BatchNormalization backward: ``x_hat`` and ``gy * x_hat`` (two input-sized arrays).
  Dropout forward: the float32 random array. LRN forward: the squared input.
* saved bytes, state a function keeps for its backward outside retained arrays: max-pooling
  argmax indexes (int32, output-sized), BN mean / var / inv_std, the dropout mask, LRN's
  scale, softmax-cross-entropy's cached softmax.
* resident bytes: parameters + gradients + optimizer state (MomentumSGD: one per parameter).

Convolutions can be charged two ways (``conv_impl``): "im2col" (the default; Chainer + CuPy
without cuDNN, what our executor runs, as above) or "cudnn" (the paper's Chainer + cuDNN 7.1:
implicit GEMM moving only x, W, y, with a workspace within Chainer's 8 MiB default limit).
Only convolution costs change; retention and the other functions stay as traced.

Calibration (the only one): ``COMPUTE_EFFICIENCY`` and ``MEMORY_EFFICIENCY`` are the
fractions of a GPU's peak FP32 throughput and memory bandwidth its kernels achieve.
``MEMORY_EFFICIENCY`` is fixed a priori at 0.80 (what simple streaming kernels reach on HBM);
``COMPUTE_EFFICIENCY`` = 0.852 was then solved (bisection) so that analytic ResNet-50 in-core
training on ``v100-16gb`` at batch 128 runs at the paper's measured 316 images/s (sec. 5.2),
with ``conv_impl="cudnn"`` because the paper ran cuDNN. With the default "im2col" the same
constants give about 281 images/s: im2col + its GEMM-layout copy move ~4x the column buffer
through memory, which no efficiency constant can hide (even 100% of peak FLOP/s would stay
below 316). tests/test_costmodel.py checks both figures. Nothing else is tuned toward the
paper's results; the same two fractions apply to every GPU preset.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from pooch_ext.errors import check_name

Shape = tuple[int, ...]

# the calibration (module docstring): ResNet-50, batch 128, v100-16gb, conv="cudnn" -> 316 img/s
COMPUTE_EFFICIENCY = 0.852
MEMORY_EFFICIENCY = 0.80   # a priori, not tuned
LAUNCH_LATENCY_S = 10e-6   # per op and pass: kernel launch + Chainer's per-function dispatch
OPTIMIZER_STATES = {"sgd": 0, "momentum_sgd": 1, "adam": 2}


@dataclass(frozen=True)
class GPU:
    """A cost-model GPU: peak FP32 FLOP/s, peak memory bandwidth (bytes/s), capacity."""

    name: str
    peak_flops: float
    mem_bytes_per_s: float
    capacity_bytes: int
    launch_latency_s: float = LAUNCH_LATENCY_S

    def time_s(self, flops: float, nbytes: float) -> float:
        """Roofline time of one op pass: the slower of compute and memory, plus launch."""
        compute = flops / (self.peak_flops * COMPUTE_EFFICIENCY)
        memory = nbytes / (self.mem_bytes_per_s * MEMORY_EFFICIENCY)
        return max(compute, memory) + self.launch_latency_s


MiB = 1 << 20
GPUS: dict[str, GPU] = {
    # the paper's Tesla V100 16 GB (x86 box: PCIe card, 14 TFLOP/s FP32, 900 GB/s HBM2);
    # capacity as nvidia-smi reports it
    "v100-16gb": GPU("v100-16gb", 14.0e12, 900e9, 16160 * MiB),
    # H100 SXM5 80 GB: 67 TFLOP/s FP32 (no tensor cores), 3.35 TB/s HBM3
    "h100": GPU("h100", 67e12, 3.35e12, 81559 * MiB),
    # H200 SXM 141 GB: same SM as H100, 4.8 TB/s HBM3e
    "h200": GPU("h200", 67e12, 4.8e12, 143771 * MiB),
}


def get_gpu(name: str | GPU) -> GPU:
    """A preset by name (or the GPU itself); unknown names list the presets."""
    if isinstance(name, GPU):
        return name
    check_name(name, GPUS, "GPU")
    return GPUS[name]


CONV_IMPLS = ("im2col", "cudnn")


def check_conv_impl(name: str) -> str:
    """'im2col' (Chainer + CuPy without cuDNN) or 'cudnn' (the paper's Chainer + cuDNN)."""
    check_name(name, CONV_IMPLS, "convolution implementation")
    return name


def optimizer_states(optimizer: str) -> int:
    """State arrays the optimizer keeps per parameter; unknown names list the known ones."""
    check_name(optimizer, OPTIMIZER_STATES, "optimizer")
    return OPTIMIZER_STATES[optimizer]


def resident_bytes(param_bytes: int, optimizer: str = "momentum_sgd") -> int:
    """Parameters + their gradients + optimizer state, which no policy moves."""
    return int(param_bytes) * (2 + optimizer_states(optimizer))


def update_time_s(gpu: GPU, param_bytes: int, n_params: int, optimizer: str = "momentum_sgd") -> float:
    """Optimizer step: one elementwise kernel per parameter array (read p, g, states; write
    p, states), plus clearing the gradients."""
    states = optimizer_states(optimizer)
    traffic = param_bytes * (2 + 2 * states + 1) + param_bytes  # update, then cleargrads
    return traffic / (gpu.mem_bytes_per_s * MEMORY_EFFICIENCY) + 2 * n_params * gpu.launch_latency_s


# ------------------------------------------------------------------ per-function rules

@dataclass(frozen=True)
class OpShapes:
    """What a rule sees of one forward op: shapes, parameter shapes, attributes."""

    name: str
    inputs: Sequence[Shape]
    outputs: Sequence[Shape]
    params: Sequence[Shape]
    attrs: dict
    differentiable: Sequence[int]   # positions in ``inputs`` that receive a gradient
    itemsize: int = 4
    conv_impl: str = "im2col"       # "im2col" (CuPy without cuDNN) or "cudnn" (the paper's)


@dataclass(frozen=True)
class OpCost:
    """FLOPs and bytes moved per pass, and the op's extra memory (see module docstring)."""

    fwd_flops: float
    fwd_bytes: float
    bwd_flops: float
    bwd_bytes: float
    transient_bytes: int = 0
    backward_transient_bytes: int = 0
    saved_bytes: int = 0


def _n(shape: Shape) -> int:
    return int(math.prod(shape))


CUDNN_WORKSPACE_LIMIT = 8 * MiB   # Chainer's default cuDNN workspace limit


def column_bytes(x: Sequence[int], y: Sequence[int], w: Sequence[int], itemsize: int) -> int:
    """Bytes of a convolution's im2col column buffer: every input channel times every kernel
    offset times every output position, per sample."""
    return int(x[0] * x[1] * math.prod(w[2:]) * math.prod(y[2:]) * itemsize)


def conv(op: OpShapes) -> OpCost:
    x, y, w = op.inputs[0], op.outputs[0], op.params[0]
    s = op.itemsize
    batch, c_in = x[0], x[1]
    ksize = w[2:]
    col = column_bytes(x, y, w, s)                        # im2col column buffer
    x_b, y_b, w_b = _n(x) * s, _n(y) * s, _n(w) * s
    has_bias = len(op.params) > 1
    wants_gx = 0 in op.differentiable
    gemm = 2.0 * _n(y) * (c_in // int(op.attrs.get("groups", 1) or 1)) * _n(ksize)
    bwd_flops = gemm * (2 if wants_gx else 1)
    if op.conv_impl == "cudnn":
        # the paper's Chainer + cuDNN: implicit GEMM, workspace within Chainer's limit
        workspace = min(col, CUDNN_WORKSPACE_LIMIT)
        return OpCost(gemm, x_b + w_b + y_b, bwd_flops,
                      x_b + 2 * y_b + w_b + (x_b + w_b if wants_gx else 0),
                      transient_bytes=workspace, backward_transient_bytes=workspace)
    copies = 2 if batch > 1 else 1                        # GEMM-layout copy of col for N > 1
    gy_copy = _n(y) * s if batch > 1 else 0
    unused_y = y_b if op.name == "Convolution2DFunction" else 0
    fwd_bytes = x_b + col * 2 * copies + w_b + y_b + (2 * y_b if has_bias else 0)
    grad_w_transient = col * copies + gy_copy
    grad_x_transient = col + gy_copy if wants_gx else 0
    bwd_bytes = (x_b + col * 2 * copies + 2 * y_b + w_b          # gW: im2col, copies, GEMM
                 + (y_b if has_bias else 0)                        # gb: sum over gy
                 + ((2 * y_b + w_b + 2 * col + x_b) if wants_gx else 0))  # gx: GEMM, col2im
    return OpCost(gemm, fwd_bytes, bwd_flops, bwd_bytes,
                  transient_bytes=col * copies + unused_y,
                  backward_transient_bytes=max(grad_w_transient, grad_x_transient))


def linear(op: OpShapes) -> OpCost:
    x, y, w = op.inputs[0], op.outputs[0], op.params[0]
    s = op.itemsize
    flops = 2.0 * x[0] * _n(w)
    wants_gx = 0 in op.differentiable
    nbytes = (_n(x) + _n(w) + _n(y)) * s
    return OpCost(flops, nbytes, flops * (2 if wants_gx else 1), nbytes * (2 if wants_gx else 1))


def batch_norm(op: OpShapes) -> OpCost:
    size, channels, s = _n(op.inputs[0]) * op.itemsize, _n(op.params[0]), op.itemsize
    # forward: mean, var (reductions), y = gamma * (x - mean) * inv_std + beta
    # backward: x_hat, gy * x_hat, two reductions, the gx kernel
    return OpCost(8.0 * size / s, 4 * size, 14.0 * size / s, 10 * size,
                  backward_transient_bytes=2 * size, saved_bytes=3 * channels * s)


def relu(op: OpShapes) -> OpCost:
    size = _n(op.inputs[0]) * op.itemsize
    return OpCost(size / op.itemsize, 2 * size, size / op.itemsize, 3 * size)


def add(op: OpShapes) -> OpCost:
    size = _n(op.outputs[0]) * op.itemsize
    # backward hands gy to both inputs without a kernel
    return OpCost(size / op.itemsize, (len(op.inputs) + 1) * size, 0.0, 0.0)


def concat(op: OpShapes) -> OpCost:
    size = _n(op.outputs[0]) * op.itemsize
    return OpCost(0.0, 2 * size, 0.0, 0.0)   # backward: split_axis returns views of gy


def reshape(op: OpShapes) -> OpCost:
    return OpCost(0.0, 0.0, 0.0, 0.0)         # views both ways


def dropout(op: OpShapes) -> OpCost:
    n = _n(op.inputs[0])
    size = n * op.itemsize
    # forward: float32 random array, then (mask, y) = f(x, r); backward gx = gy * mask
    return OpCost(2.0 * n, n * 4 * 2 + 3 * size, 1.0 * n, 3 * size,
                  transient_bytes=n * 4, saved_bytes=size)


def _pool_window(op: OpShapes) -> int:
    a = op.attrs
    ksize = a["ksize"] if "ksize" in a else (a["kh"], a["kw"])
    return _n(tuple(ksize))


def max_pool(op: OpShapes) -> OpCost:
    x, y = _n(op.inputs[0]), _n(op.outputs[0])
    s = op.itemsize
    window = _pool_window(op)
    return OpCost(float(y * window), (x + y) * s + y * 4, float(x), (x + y) * s + y * 4,
                  saved_bytes=y * 4)   # int32 argmax indexes


def avg_pool(op: OpShapes) -> OpCost:
    x, y = _n(op.inputs[0]), _n(op.outputs[0])
    s = op.itemsize
    window = _pool_window(op)
    return OpCost(float(y * window), (x + y) * s, float(x), (x + y) * s)


def lrn(op: OpShapes) -> OpCost:
    n = _n(op.inputs[0])
    size = n * op.itemsize
    depth = int(op.attrs.get("n", 5))
    # forward: x^2 (temporary), windowed channel sum -> scale (kept), y = x * scale^-beta
    # backward: summand = y * gy / scale, windowed sum, gx
    return OpCost(float(n * (depth + 4)), 6 * size, float(n * (depth + 8)), 8 * size,
                  transient_bytes=size, saved_bytes=size)


def softmax_cross_entropy(op: OpShapes) -> OpCost:
    n = _n(op.inputs[0])
    size = n * op.itemsize
    # log-softmax, the loss reduction; the softmax is cached for backward
    return OpCost(6.0 * n, 4 * size, 3.0 * n, 3 * size, saved_bytes=size)


def activation(flops_forward: float, flops_backward: float) -> Callable[[OpShapes], OpCost]:
    """An elementwise activation reading x and writing y (backward: y or x, gy -> gx)."""
    def cost(op: OpShapes) -> OpCost:
        n = _n(op.inputs[0])
        size = n * op.itemsize
        return OpCost(flops_forward * n, 2 * size, flops_backward * n, 3 * size)
    return cost


def fixed_batch_norm(op: OpShapes) -> OpCost:
    size, s = _n(op.inputs[0]) * op.itemsize, op.itemsize
    # forward: y = gamma * (x - mean) * inv_std + beta with given statistics, no reductions
    # backward: gx = gy * gamma * inv_std, and the gamma / beta reductions
    return OpCost(4.0 * size / s, 2 * size, 5.0 * size / s, 4 * size)


def embed_id(op: OpShapes) -> OpCost:
    out = _n(op.outputs[0]) * op.itemsize
    ids = _n(op.inputs[0]) * 4
    # forward: a gather of rows; backward: a scatter-add of gy into the weight gradient
    return OpCost(0.0, 2 * out + ids, float(_n(op.outputs[0])), 3 * out + ids)


def lstm(op: OpShapes) -> OpCost:
    cell = _n(op.inputs[0])
    s = op.itemsize
    # forward: four gate activations and the cell update per element of c; reads c_prev and
    # the 4H pre-activations, writes c and h; backward reads them again with gc, gh
    return OpCost(12.0 * cell, 7 * cell * s, 20.0 * cell, 10 * cell * s)


def mean(op: OpShapes) -> OpCost:
    n, out = _n(op.inputs[0]), _n(op.outputs[0])
    s = op.itemsize
    return OpCost(float(n), (n + out) * s, float(n), (n + out) * s)   # backward: broadcast


def stack(op: OpShapes) -> OpCost:
    size = _n(op.outputs[0]) * op.itemsize
    return OpCost(0.0, 2 * size, 0.0, 0.0)   # backward: separate returns views of gy


def op_times(gpu: GPU, cost: OpCost) -> tuple[float, float]:
    """(forward seconds, backward seconds) of an op on ``gpu``."""
    return gpu.time_s(cost.fwd_flops, cost.fwd_bytes), gpu.time_s(cost.bwd_flops, cost.bwd_bytes)

