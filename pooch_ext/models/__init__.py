"""Networks of the experiments, as trainable Chainer links (input ``x`` -> logits).

``get_model(name)`` builds a fresh network; ``default_input_size(name)`` is the per-sample
input shape it was designed for ((C, H, W), or (C, T, H, W) for video). The classifier head
of ResNet-18 / ResNet-50 / ResNeXt-101 3D / small-resnet pools globally over whatever spatial size it
gets, so those networks run at any input size; AlexNet and VGG-16 have fixed-size fully
connected layers, as in the originals, and need their input size.
"""
from __future__ import annotations

from typing import Callable

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer

from pooch_ext.errors import check_name
from pooch_ext.models.alexnet import AlexNet
from pooch_ext.models.resnet18 import ResNet18
from pooch_ext.models.resnet50 import ResNet50
from pooch_ext.models.resnext3d import ResNeXt101_3D
from pooch_ext.models.small_resnet import SmallResNet
from pooch_ext.models.vgg16 import VGG16

# name -> (constructor taking n_classes, default n_classes, default per-sample input size)
_REGISTRY: dict[str, tuple[Callable[[int], chainer.Chain], int, tuple[int, ...]]] = {
    "resnet50": (ResNet50, 1000, (3, 224, 224)),
    "alexnet": (AlexNet, 1000, (3, 227, 227)),
    "resnext101-3d": (ResNeXt101_3D, 400, (3, 16, 112, 112)),
    "vgg16": (VGG16, 1000, (3, 224, 224)),
    "small-resnet": (SmallResNet, 10, (3, 32, 32)),
    "resnet18": (ResNet18, 1000, (3, 224, 224)),
}
MODEL_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def _entry(name: str):
    check_name(name, MODEL_NAMES, "model")
    return _REGISTRY[name]


def get_model(name: str, n_classes: int | None = None) -> chainer.Chain:
    """A freshly initialised network; ``n_classes`` defaults to the original's label count."""
    constructor, default_classes, _ = _entry(name)
    n_classes = default_classes if n_classes is None else int(n_classes)
    if n_classes < 1:
        raise ValueError(f"n_classes must be >= 1, got {n_classes}")
    return constructor(n_classes)


def default_input_size(name: str) -> tuple[int, ...]:
    """Per-sample input shape the network was designed for: (C, H, W) or (C, T, H, W)."""
    return _entry(name)[2]


def default_n_classes(name: str) -> int:
    """The original's label count (ImageNet 1000, Kinetics 400, CIFAR-10 10)."""
    return _entry(name)[1]
