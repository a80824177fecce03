"""Exact re-execution of one forward function, for recompute-class feature maps.

Recomputation must give the original output bit for bit and change nothing else. Calling a
FunctionNode's ``forward`` again does that for stateless functions (convolution, linear, ReLU,
pooling, concat, add, reshape): it bypasses ``apply``, so no graph node is made, no hook
fires, and what ``forward`` sets on the node (pooling argmax, retain indexes) is set to equal
values. Two functions need their own rule:

* BatchNormalization: ``forward`` would update the running statistics a second time; instead
  the output is rebuilt with Chainer's own ``_apply_bn_fwd`` from the mean and inv_std the
  node stored, which is the very expression the original forward evaluated;
* Dropout: ``forward`` reuses the node's mask when it has one; a missing mask is an error
  (drawing a new one would change the result and the random state).

Which function uses which rule is ``pooch_ext.functions.FUNCTIONS``; nothing else is ever
recomputed.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy

from pooch_ext.errors import PoochError
from pooch_ext.hooks.chainer_refs import apply_batch_norm_forward, batch_norm_impl
from pooch_ext.functions import BATCHNORM, DROPOUT, FORWARD, FUNCTIONS, recompute_refusal


class RecomputeError(PoochError):
    """A function cannot be re-run exactly."""


def _forward_again(function: Any, inputs: Sequence[Any]) -> tuple:
    return tuple(function.forward(tuple(inputs)))


def _batch_normalization(function: Any, inputs: Sequence[Any]) -> tuple:
    from chainer import backend
    from chainer.functions.normalization import batch_normalization as bn

    if not isinstance(batch_norm_impl(function), bn.GeneralBatchNormalizationImpl):
        raise RecomputeError("BatchNormalization: only the general (non-cuDNN, non-iDeep) "
                             "implementation can be recomputed exactly")
    if function.mean is None or function.inv_std is None:
        raise RecomputeError("BatchNormalization: the node holds no stored statistics")
    x, gamma, beta = inputs
    interm_dtype = numpy.promote_types(x.dtype, gamma.dtype)
    expander = function.expander
    gamma = gamma[expander].astype(interm_dtype, copy=False)
    beta = beta[expander].astype(interm_dtype, copy=False)
    xp = backend.get_array_module(x)
    y = apply_batch_norm_forward(xp, x, function.mean[expander], function.inv_std[expander],
                                 gamma, beta)
    return (y,)


def _dropout(function: Any, inputs: Sequence[Any]) -> tuple:
    if getattr(function, "mask", None) is None:
        raise RecomputeError("Dropout: the node holds no mask (cuDNN dropout cannot be recomputed)")
    return _forward_again(function, inputs)


KINDS: dict[str, Callable[[Any, Sequence[Any]], tuple]] = {
    FORWARD: _forward_again, BATCHNORM: _batch_normalization, DROPOUT: _dropout}
RULES: dict[str, Callable[[Any, Sequence[Any]], tuple]] = {
    name: KINDS[function.recompute] for name, function in FUNCTIONS.items() if function.recompute}


def recompute(function: Any, inputs: Sequence[Any]) -> tuple:
    """The outputs of ``function`` on ``inputs`` (arrays), exactly as its forward made them."""
    name = type(function).__name__
    rule = RULES.get(name)
    if rule is None:
        raise RecomputeError(recompute_refusal(name) or f"{name} has no recompute rule")
    return rule(function, inputs)
