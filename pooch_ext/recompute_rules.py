"""Which Chainer functions may be recomputed, shared by the planner and the executor.

Recomputation must reproduce the original output bit for bit and have no side effects, so a
function is listed only when hooks/executor.py has an exact rule for it (BatchNormalization
reuses the mean / inv_std it stored and does not touch running statistics again; Dropout
reuses its mask). Names are ``type(function_node).__name__``. Anything else is never
recomputed: its output may be kept or swapped only.
"""
from __future__ import annotations

RECOMPUTABLE: frozenset[str] = frozenset({
    "Convolution2DFunction",
    "ConvolutionND",
    "LinearFunction",
    "ReLU",
    "BatchNormalization",
    "FixedBatchNormalization",
    "Dropout",
    "MaxPooling2D",
    "MaxPoolingND",
    "AveragePooling2D",
    "AveragePoolingND",
    "LocalResponseNormalization",
    "Concat",
    "Add",
    "Reshape",
})


def recompute_refusal(name: str) -> str:
    """'' when ``name`` can be recomputed, else the reason it cannot."""
    return "" if name in RECOMPUTABLE else f"{name} has no exact recompute rule"
