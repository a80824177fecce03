"""Cost model rules: im2col transients, roofline times, presets, the one calibration."""
from __future__ import annotations

import pytest

from pooch_ext.analytic import costmodel as cm
from pooch_ext.analytic.tracing import analytic_profile
from pooch_ext.errors import PoochError, UnknownNameError
from pooch_ext.functions import op_cost


def _conv(batch, name="Convolution2DFunction", groups=1, differentiable=(0,), impl="im2col"):
    return cm.OpShapes(name, [(batch, 8, 10, 10)], [(batch, 16, 10, 10)],
                       [(16, 8 // groups, 3, 3)], {"groups": groups}, list(differentiable),
                       4, impl)


def test_gpu_presets_and_unknown_names():
    v100, h100, h200 = (cm.get_gpu(n) for n in ("v100-16gb", "h100", "h200"))
    assert v100.capacity_bytes < 17e9 < h100.capacity_bytes < h200.capacity_bytes
    assert h200.mem_bytes_per_s > h100.mem_bytes_per_s > v100.mem_bytes_per_s
    with pytest.raises(UnknownNameError, match="known: v100-16gb, h100, h200"):
        cm.get_gpu("a100")
    with pytest.raises(UnknownNameError):
        cm.check_conv_impl("winograd")


def test_im2col_column_buffer_is_the_convolution_transient():
    col = 4 * 8 * 9 * 100 * 4                  # N * C * kh * kw * outH * outW * 4 bytes
    y = 4 * 16 * 100 * 4
    cost = op_cost(_conv(4))
    # forward: col + its GEMM-layout copy (N > 1) + the unused output buffer of forward_gpu
    assert cost.transient_bytes == 2 * col + y
    # backward: gW rebuilds col + copy, plus a copy of gy
    assert cost.backward_transient_bytes == 2 * col + y
    single = op_cost(_conv(1))
    assert single.transient_bytes == col // 4 + y // 4        # batch 1: no copy
    nd = op_cost(_conv(4, "ConvolutionND", groups=2))
    assert nd.transient_bytes == 2 * col                      # ND path has no unused output
    assert nd.fwd_flops == cost.fwd_flops / 2                 # groups divide the GEMM
    first_layer = op_cost(_conv(4, differentiable=()))
    assert first_layer.bwd_flops == cost.bwd_flops / 2        # no gradient for the input
    cudnn = op_cost(_conv(4, impl="cudnn"))
    assert cudnn.transient_bytes == min(col, cm.CUDNN_WORKSPACE_LIMIT)
    assert cudnn.fwd_bytes < cost.fwd_bytes


def test_saved_state_and_elementwise_rules():
    bn = op_cost(cm.OpShapes("BatchNormalization", [(2, 16, 8, 8)], [(2, 16, 8, 8)],
                                [(16,), (16,)], {}, [0]))
    assert bn.saved_bytes == 3 * 16 * 4 and bn.backward_transient_bytes == 2 * 2 * 16 * 64 * 4
    pool = op_cost(cm.OpShapes("MaxPoolingND", [(2, 16, 8, 8)], [(2, 16, 4, 4)], [],
                                  {"ksize": (2, 2)}, [0]))
    assert pool.saved_bytes == 2 * 16 * 16 * 4          # int32 argmax per output
    drop = op_cost(cm.OpShapes("Dropout", [(2, 100)], [(2, 100)], [], {}, [0]))
    assert drop.saved_bytes == 800 and drop.transient_bytes == 800
    with pytest.raises(PoochError, match="no rule for Chainer function 'Elu'"):
        op_cost(cm.OpShapes("Elu", [(2,)], [(2,)], [], {}, [0]))


def test_roofline_time():
    gpu = cm.get_gpu("v100-16gb")
    compute_bound = gpu.time_s(1e12, 1.0)
    assert compute_bound == pytest.approx(
        1e12 / (gpu.peak_flops * cm.COMPUTE_EFFICIENCY) + gpu.launch_latency_s)
    memory_bound = gpu.time_s(1.0, 1e9)
    assert memory_bound == pytest.approx(
        1e9 / (gpu.mem_bytes_per_s * cm.MEMORY_EFFICIENCY) + gpu.launch_latency_s)
    assert cm.get_gpu("h200").time_s(1.0, 1e9) < cm.get_gpu("h100").time_s(1.0, 1e9) < memory_bound


def test_resident_bytes_count_gradients_and_optimizer_state():
    assert cm.resident_bytes(1000) == 3000                     # MomentumSGD
    assert cm.resident_bytes(1000, "adam") == 4000
    with pytest.raises(UnknownNameError):
        cm.resident_bytes(1000, "lion")
    with pytest.raises(UnknownNameError, match="unknown optimizer 'lion'"):
        cm.update_time_s(cm.get_gpu("h100"), 1000, 2, "lion")


def test_calibration_resnet50_v100_near_paper_throughput():
    """The one calibration: ResNet-50 in-core, batch 128, v100-16gb, the paper's cuDNN."""
    cudnn = analytic_profile("resnet50", 128, conv="cudnn").summary()
    assert 128 / cudnn["iteration_s"] == pytest.approx(316, rel=0.02)
    im2col = analytic_profile("resnet50", 128).summary()       # what our executor runs
    assert 250 < 128 / im2col["iteration_s"] < 316
    h100 = analytic_profile("resnet50", 128, gpu="h100").summary()
    assert h100["iteration_s"] < im2col["iteration_s"] / 3
