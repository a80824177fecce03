"""Shared fixtures; GPU tests (mark ``gpu``) skip cleanly where CUDA is absent."""
from __future__ import annotations

import pytest

import pooch_ext  # noqa: F401  (makes chainer importable on NumPy 2 before any test imports it)
from pooch_ext.builder import ProfileBuilder
from pooch_ext.links import get_link
from pooch_ext.profile import Device


def tracked_device(**kwargs):
    """A CPU device that counts the arrays the graph holds instead of every allocation: for
    tests of the runtime's logic on networks so small that im2col scratch, which no plan
    moves, would leave no room between the minimum budget and the in-core need (measured
    memory has its own tests: test_memory_fidelity.py, the promise matrix)."""
    from pooch_ext.hooks.cpu_device import CpuDevice

    return CpuDevice(measure=False, **kwargs)


def saved_profile(tmp_path_factory, profile, folder: str = "profiles"):
    """``profile`` written to a fresh folder: the profile folders the command-line tests
    read (module-scoped fixtures pass their ``tmp_path_factory``)."""
    path = tmp_path_factory.mktemp(folder) / "profile"
    profile.save(path)
    return path


def pytest_configure(config):
    """``POOCH_TEST_COPY_DELAY_S`` (seconds): every copy of the CPU device held back at
    least that long; ``POOCH_TEST_COPY_JITTER_S``: half the copies a random 0..that more (a
    loaded machine: CI's failure on 2026-11-26 came from copies slower than here). The
    suite must pass either way (tests/test_cpu_device.py times copies: leave it out)."""
    import os

    fixed = float(os.environ.get("POOCH_TEST_COPY_DELAY_S", 0) or 0)
    jitter = float(os.environ.get("POOCH_TEST_COPY_JITTER_S", 0) or 0)
    if fixed or jitter:
        hold_copies_back(fixed, jitter, setattr)


def hold_copies_back(fixed: float, jitter: float, patch) -> None:
    """Every copy of the CPU device held back ``fixed`` seconds more, half of them a random
    0..``jitter`` more; ``patch`` is ``setattr`` (the whole session) or a monkeypatch's."""
    import random
    import time
    from types import SimpleNamespace

    from pooch_ext.hooks import cpu_device

    rng = random.Random(0)
    init = cpu_device.CopyEngine.__init__

    def engine(self, name, seconds, delay_s=0.0):
        init(self, name, seconds, delay_s + 1e-9)     # each copy then sleeps before it runs

    def sleep(seconds):
        time.sleep(seconds + fixed + (rng.random() * jitter if rng.random() < 0.5 else 0.0))
    patch(cpu_device.CopyEngine, "__init__", engine)
    patch(cpu_device, "time", SimpleNamespace(perf_counter=time.perf_counter, sleep=sleep))


def cuda_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA and CuPy")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def branchy_builder() -> ProfileBuilder:
    """conv-bn-relu stem, two conv branches concatenated, a residual add, pool, linear, loss."""
    b = ProfileBuilder(Device("toy", 1 << 30), get_link("pcie3"), {"model": "toy", "batch": 4})
    x = b.input((4, 3, 8, 8))
    t = b.input((4,), "int32")
    (h,) = b.forward("Convolution2DFunction", [x], [((4, 8, 8, 8), "float32")], 1e-3, 2e-3,
                     retain_inputs=[0], transient_bytes=4 * 27 * 64 * 4, label="stem/conv")
    (h,) = b.forward("BatchNormalization", [h], [((4, 8, 8, 8), "float32")], 2e-4, 4e-4,
                     retain_inputs=[0], saved_bytes=64, label="stem/bn")
    (h,) = b.forward("ReLU", [h], [((4, 8, 8, 8), "float32")], 1e-4, 1e-4, retain_outputs=[0])
    (a,) = b.forward("Convolution2DFunction", [h], [((4, 4, 8, 8), "float32")], 8e-4, 1.6e-3,
                     retain_inputs=[0], label="branch_a")
    (c,) = b.forward("Convolution2DFunction", [h], [((4, 4, 8, 8), "float32")], 8e-4, 1.6e-3,
                     retain_inputs=[0], label="branch_b")
    (m,) = b.forward("Concat", [a, c], [((4, 8, 8, 8), "float32")], 1e-4, 1e-4)
    (s,) = b.forward("Add", [m, h], [((4, 8, 8, 8), "float32")], 1e-4, 1e-4)
    (d,) = b.forward("Dropout", [s], [((4, 8, 8, 8), "float32")], 1e-4, 1e-4, saved_bytes=4 * 512 * 4)
    (p,) = b.forward("AveragePooling2D", [d], [((4, 8, 1, 1), "float32")], 1e-4, 1e-4)
    (y,) = b.forward("LinearFunction", [p], [((4, 10), "float32")], 1e-4, 2e-4, retain_inputs=[0])
    b.forward("SoftmaxCrossEntropy", [y, t], [((), "float32")], 1e-4, 1e-4,
              retain_inputs=[0, 1], differentiable=[0])
    b.resident(3 * 4 * (8 * 3 * 9 + 2 * 4 * 8 * 9 + 80 + 16))
    return b


@pytest.fixture
def toy_profile():
    return branchy_builder().build(update_s=1e-4)
