"""Measured profiles of the experiment networks: a few real training iterations under PoocH.

``measured_profile("small-resnet", 32)`` builds the network, trains it for ``iters``
iterations on synthetic data with every feature map swapped (PoocH's profiling phase), and
returns the measured Profile: on the current CUDA device when CuPy sees one (copies timed,
link fitted from them), else on the CPU device (compute timed on the CPU, copy
times from ``link``). A ``budget`` is enforced on the device while profiling.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from pooch_ext.analytic.tracing import resolve_input_size
from pooch_ext.errors import PoochError
from pooch_ext.links import Link
from pooch_ext.hooks.runtime_device import RuntimeDevice
from pooch_ext.models import default_n_classes, get_model
from pooch_ext.profile import Profile


def cuda_available() -> bool:
    """True when CuPy is installed and sees a GPU."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:   # noqa: BLE001 - no CuPy, no driver, no device: all mean "no"
        return False


def setup_model(name: str, gpu: bool, seed: int = 0) -> tuple[Any, Any]:
    """A freshly initialised network (same seed, same weights) and its MomentumSGD optimizer."""
    from pooch_ext.testing import make_optimizer

    np.random.seed(seed)
    model = get_model(name)
    if gpu:
        model.to_gpu()
    return model, make_optimizer(model, "momentum")


def measured_profile(model: str, batch: int, input_size: str | tuple | None = None,
                     budget: int | str | None = None, iters: int = 3,
                     link: str | Link = "pcie3", gpu: bool | None = None,
                     device: RuntimeDevice | None = None) -> Profile:
    """Profile ``model`` at ``batch`` by training it ``iters`` iterations (see module doc).
    ``device``: the device to profile on (e.g. a ``CupyDevice(throttle="pcie3")`` to profile
    as if on that link); by default the model's own."""
    from pooch_ext.testing import synthetic_batches, train

    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    shape = resolve_input_size(model, input_size)
    gpu = cuda_available() if gpu is None else gpu
    net, optimizer = setup_model(model, gpu)
    xp = np
    if gpu:
        import cupy as xp
    batches = synthetic_batches(iters, batch, shape, default_n_classes(model), xp=xp)
    result = train(net, optimizer, batches, {"profile_iters": iters, "budget": budget,
                                             "policy": None, "verbose": False,
                                             "link": "auto" if gpu else link,
                                             "device": device})
    if result.error is not None:
        raise result.error
    profile = result.pooch.profile
    if profile is None:
        raise PoochError(f"profiling {model} produced no profile")
    profile.meta.update({"model": model, "batch": batch, "input_size": list(shape)})
    return profile
