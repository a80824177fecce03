"""Everything PoocH knows about each Chainer function, in one table.

One entry per function (``type(function_node).__name__``): its **shape rule** (rescaling a
recorded trace to another batch or input size, ``pooch_ext.analytic.shapes``), its **cost rule**
(FLOPs, bytes and extra memory for analytic profiles, ``pooch_ext.analytic.costmodel``) and its
**recompute rule**: how the executor re-runs it exactly, or why it never does.

Recomputation must reproduce the original output bit for bit and change nothing else, so a
function is recomputable only with an exact rule (hooks/recompute.py implements the kinds):

* ``FORWARD``: calling the node's ``forward`` again (stateless functions: what it sets on the
  node, such as pooling's argmax, is set to equal values);
* ``BATCHNORM``: BatchNormalization rebuilt from the mean and inv_std it stored, with no
  second running-average update;
* ``DROPOUT``: Dropout reusing its mask.

A function missing here is refused with a clear error wherever its rule is needed (never
guessed), and never recomputed; tests/test_functions.py checks every function the example
networks use has all three entries.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pooch_ext.analytic import costmodel as cost
from pooch_ext.analytic import shapes
from pooch_ext.analytic.costmodel import OpCost, OpShapes
from pooch_ext.errors import PoochError
from pooch_ext.analytic.shapes import ShapeRuleError

FORWARD, BATCHNORM, DROPOUT = "forward", "batchnorm", "dropout"


@dataclass(frozen=True)
class Function:
    """The rules of one Chainer function; ``recompute`` is a kind above or "" with the reason
    in ``not_recomputable``."""

    shape: Callable[..., shapes.Rule]
    cost: Callable[[OpShapes], OpCost]
    recompute: str = ""
    not_recomputable: str = ""

    def __post_init__(self) -> None:
        if bool(self.recompute) == bool(self.not_recomputable):
            raise ValueError("a function is either recomputable or says why not")


FUNCTIONS: dict[str, Function] = {
    "Convolution2DFunction": Function(shapes.conv2d, cost.conv, FORWARD),
    "ConvolutionND": Function(shapes.conv_nd, cost.conv, FORWARD),
    "LinearFunction": Function(shapes.linear, cost.linear, FORWARD),
    "ReLU": Function(shapes.same_as_first, cost.relu, FORWARD),
    "Sigmoid": Function(shapes.same_as_first, cost.activation(4.0, 3.0),
                        not_recomputable="no exact recompute rule verified yet"),
    "Tanh": Function(shapes.same_as_first, cost.activation(4.0, 3.0),
                     not_recomputable="no exact recompute rule verified yet"),
    "LeakyReLU": Function(shapes.same_as_first, cost.activation(2.0, 2.0),
                          not_recomputable="no exact recompute rule verified yet"),
    "BatchNormalization": Function(shapes.same_as_first, cost.batch_norm, BATCHNORM),
    "FixedBatchNormalization": Function(shapes.same_as_first, cost.fixed_batch_norm, FORWARD),
    "Dropout": Function(shapes.same_as_first, cost.dropout, DROPOUT),
    "MaxPooling2D": Function(shapes.pool_2d, cost.max_pool, FORWARD),
    "MaxPoolingND": Function(shapes.pool_nd, cost.max_pool, FORWARD),
    "AveragePooling2D": Function(shapes.pool_2d, cost.avg_pool, FORWARD),
    "AveragePoolingND": Function(shapes.pool_nd, cost.avg_pool, FORWARD),
    "LocalResponseNormalization": Function(shapes.same_as_first, cost.lrn, FORWARD),
    "Concat": Function(shapes.concat, cost.concat, FORWARD),
    "Add": Function(shapes.same_as_first, cost.add, FORWARD),
    "Reshape": Function(shapes.reshape, cost.reshape, FORWARD),
    "SoftmaxCrossEntropy": Function(shapes.softmax_cross_entropy, cost.softmax_cross_entropy,
                                    not_recomputable="the loss: its output is a scalar"),
    "EmbedIDFunction": Function(shapes.embed_id, cost.embed_id,
                                not_recomputable="no exact recompute rule verified yet"),
    "LSTM": Function(shapes.lstm, cost.lstm,
                     not_recomputable="two outputs (c, h); no exact recompute rule yet"),
    "Mean": Function(shapes.mean, cost.mean,
                     not_recomputable="no exact recompute rule verified yet"),
    "Stack": Function(shapes.stack, cost.stack,
                      not_recomputable="no exact recompute rule verified yet"),
}

RECOMPUTABLE: frozenset[str] = frozenset(name for name, f in FUNCTIONS.items() if f.recompute)


def recompute_refusal(name: str) -> str:
    """'' when ``name`` can be recomputed, else the reason it cannot."""
    function = FUNCTIONS.get(name)
    if function is None:
        return f"{name} has no exact recompute rule"
    return "" if function.recompute else f"{name}: {function.not_recomputable}"


def _known() -> str:
    return ", ".join(sorted(FUNCTIONS))


def op_cost(op: OpShapes) -> OpCost:
    """FLOPs, bytes and extra memory of one op; a function without a rule is an error."""
    function = FUNCTIONS.get(op.name)
    if function is None:
        raise PoochError(f"the cost model has no rule for Chainer function {op.name!r} "
                         f"(known: {_known()})")
    return function.cost(op)


def shape_rule(name: str, where: str) -> Callable[..., shapes.Rule]:
    """The shape rule of function ``name`` (``where``: the op, for the error)."""
    function = FUNCTIONS.get(name)
    if function is None:
        raise ShapeRuleError(f"{where}: no shape rule for Chainer function {name!r}; "
                             f"known: {_known()}")
    return function.shape
