"""ReLU's backward from a binarized map (Gist's Binarize, issue 16): the gradient needs only
where the output was positive, so a binarized map decodes to a one-byte bool mask instead of
a float map four or eight times its size.

Chainer's ReLU backward reads its retained output ``y`` and computes ``gy * (y > 0)`` on
NumPy, ``y > 0 ? gy : 0`` on CuPy (its kernel; cuDNN's backward gives the same select). On
the mask ``m == (y > 0)`` the same expressions give the same bits: ``gy * m`` and
``m ? gy : 0``. ``read_mask`` makes one ReLU node run its backward that way; the executor
calls it where it puts a binarized map back (hooks/map_actions.py).
"""
from __future__ import annotations

import functools
from typing import Any

import chainer
from chainer import function_node, utils

from pooch_ext.hooks.chainer_refs import WeaklyBound, retained_outputs


class MaskedReLUGrad(function_node.FunctionNode):
    """``gx = gy`` where ``mask`` is set, else 0: ReLUGrad2's result from the mask."""

    def __init__(self, mask: Any) -> None:
        super().__init__()
        self.mask = mask

    def forward_cpu(self, inputs: tuple) -> tuple:
        gy, = inputs
        return utils.force_array(gy * self.mask, dtype=gy.dtype),   # ReLUGrad2: gy * (b > 0)

    def forward_gpu(self, inputs: tuple) -> tuple:
        gy, = inputs
        return _masked_kernel()(self.mask, gy),

    def backward(self, indexes: tuple, grad_outputs: tuple) -> tuple:
        return MaskedReLUGrad(self.mask).apply(grad_outputs)


@functools.lru_cache(maxsize=1)
def _masked_kernel() -> Any:
    """Chainer's ``relu_bwd`` kernel (``y > 0 ? gy : (T)0``) reading the mask instead of y."""
    return chainer.backends.cuda.elementwise(
        "bool m, T gy", "T gx", "gx = m ? gy : (T)0", "pooch_masked_relu_bwd")


def _masked_backward(function: Any, indexes: tuple, grad_outputs: tuple) -> tuple:
    mask, = retained_outputs(function)
    return MaskedReLUGrad(mask).apply(grad_outputs)


def read_mask(function: Any) -> None:
    """Make this one ReLU node's backward read its retained output as a bool mask."""
    function.backward = WeaklyBound(_masked_backward, function)
