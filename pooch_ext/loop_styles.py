"""Training loops in the styles users write, and small networks for them: what a budget
accepted on the first iteration must survive (tests/test_later_iterations.py,
experiments/later_iterations.py). A loop keeps ``loss`` through the next forward (with the
batch it made for it, where nothing else holds that), or L.Classifier keeps ``self.loss``,
or it drops it, or clears the gradients before its forward; ``chainer.grad`` runs a first
backward pass before ``backward`` runs the graph again (to the output, or through every op
to the input); gradients accumulate over two iterations before each update."""
from __future__ import annotations

import contextlib

import numpy as np

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer
import chainer.functions as F
import chainer.links as L

from pooch_ext.errors import BudgetTooSmallError
from pooch_ext.testing import model_state

ITERS = 4


class PoolNet(chainer.Chain):
    """Max pooling keeps an int64 argmax per output (twice the bytes of a float32 map)."""

    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.c1 = L.Convolution2D(3, 8, 3, pad=1)
            self.c2 = L.Convolution2D(8, 16, 3, pad=1)
            self.fc = L.Linear(16 * 4 * 4, 5)

    def forward(self, x):
        h = F.max_pooling_2d(F.relu(self.c1(x)), 2)
        h = F.max_pooling_2d(F.relu(self.c2(h)), 2)
        return self.fc(h)


class WideNet(chainer.Chain):
    """Where a forward op binds the smallest budget (the net the overrun was found on):
    the argmax arrays the last graph keeps count there."""

    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.c1 = L.Convolution2D(3, 16, 3, pad=1)
            self.c2 = L.Convolution2D(16, 32, 3, pad=1)
            self.c3 = L.Convolution2D(32, 32, 3, pad=1)
            self.fc = L.Linear(32 * 8 * 8, 5)

    def forward(self, x):
        h = F.max_pooling_2d(F.relu(self.c1(x)), 2)
        h = F.relu(self.c2(h))
        h = F.max_pooling_2d(F.relu(self.c3(h)), 2)
        return self.fc(h)


class NormNet(chainer.Chain):
    """BatchNormalization keeps its batch statistics on the node."""

    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.c1 = L.Convolution2D(3, 8, 3, pad=1)
            self.bn = L.BatchNormalization(8)
            self.c2 = L.Convolution2D(8, 8, 3, pad=1)
            self.fc = L.Linear(8 * 16 * 16, 5)

    def forward(self, x):
        return self.fc(F.relu(self.c2(F.relu(self.bn(self.c1(x))))))


class WeightyMLP(chainer.Chain):
    """Weights far larger than its maps: what a loop holds of their gradients decides."""

    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(3 * 16 * 16, 512)
            self.l2 = L.Linear(512, 512)
            self.l3 = L.Linear(512, 5)

    def forward(self, x):
        return self.l3(F.relu(self.l2(F.relu(self.l1(x)))))


class WideInputMLP(chainer.Chain):
    """An input far wider than any map (pixels into a narrow MLP): where a loop makes the
    next batch while it still holds the last, after the last op, it holds the most."""

    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(3 * 32 * 32, 16)
            self.l2 = L.Linear(16, 5)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


def batches(n: int = ITERS, side: int = 16, batch: int = 8) -> list:
    rng = np.random.RandomState(3)
    return [(rng.rand(batch, 3, side, side).astype(np.float32),
             rng.randint(0, 5, batch).astype(np.int32)) for _ in range(n)]


def keeps_loss(model, optimizer, batches, values):
    for x, t in batches:
        loss = F.softmax_cross_entropy(model(x), t)   # the last graph lives until here
        model.cleargrads()
        loss.backward()
        optimizer.update()
        values.append(float(loss.array))


def new_batches(model, optimizer, batches, values):
    for x, t in batches:
        x, t = x.copy(), t.copy()          # each batch made as it is needed (a data iterator):
        loss = F.softmax_cross_entropy(model(x), t)   # the last one only the kept graph holds
        model.cleargrads()
        loss.backward()
        optimizer.update()
        values.append(float(loss.array))


def clears_first(model, optimizer, batches, values):
    for x, t in batches:
        model.cleargrads()                 # before the forward: it holds no gradient
        loss = F.softmax_cross_entropy(model(x), t)
        loss.backward()
        optimizer.update()
        values.append(float(loss.array))


def classifier(model, optimizer, batches, values):
    classifier = L.Classifier(model)                   # holds self.loss, self.y
    for x, t in batches:
        optimizer.update(classifier, x, t)
        values.append(float(classifier.loss.array))


def drops_loss(model, optimizer, batches, values):
    for x, t in batches:
        loss = F.softmax_cross_entropy(model(x), t)
        model.cleargrads()
        loss.backward()
        optimizer.update()
        values.append(float(loss.array))
        del loss


def grad_then_backward(model, optimizer, batches, values):
    for x, t in batches:
        y = model(x)
        loss = F.softmax_cross_entropy(y, t)
        gy, = chainer.grad([loss], [y])                  # a first, partial backward pass
        model.cleargrads()
        loss.backward()                                  # the second runs the whole graph
        optimizer.update()
        values.append((float(loss.array), float(abs(gy.array).sum())))


def input_saliency(model, optimizer, batches, values):
    for x, t in batches:
        x = chainer.Variable(x)
        loss = F.softmax_cross_entropy(model(x), t)
        gx, = chainer.grad([loss], [x])                  # a first pass through every op
        model.cleargrads()
        loss.backward()                                  # the second runs them all again
        optimizer.update()
        values.append((float(loss.array), float(abs(gx.array).sum())))


def accumulates(model, optimizer, batches, values):
    model.cleargrads()
    for k, (x, t) in enumerate(batches):
        loss = F.softmax_cross_entropy(model(x), t) / 2
        loss.backward()                                  # gradients summed over two batches
        if k % 2:
            optimizer.update()                           # the first update: after two
            model.cleargrads()
            values.append(float(loss.array))


LOOPS = {"keeps_loss": keeps_loss, "new_batches": new_batches, "clears_first": clears_first,
         "classifier": classifier,
         "drops_loss": drops_loss, "grad_then_backward": grad_then_backward,
         "input_saliency": input_saliency, "accumulates": accumulates}
NETS = {"pool": PoolNet, "norm": NormNet, "wide": WideNet, "mlp": WeightyMLP,
        "input": WideInputMLP}
# the shapes the overrun was found with; the pixels a narrow MLP takes
DATA = {"wide": dict(side=32, batch=32), "input": dict(side=32, batch=32)}


def fresh(net: str) -> tuple:
    """(model, MomentumSGD on it) of ``net``, the same weights every call (seed 0)."""
    np.random.seed(0)
    model = NETS[net]()
    optimizer = chainer.optimizers.MomentumSGD(0.05)
    optimizer.setup(model)
    return model, optimizer


def run(net: str, loop: str, pooch: dict | None) -> tuple:
    """(logged values, final state, initial state, the PoocH object or None, the
    BudgetTooSmallError it raised or None) of ``loop`` training ``net`` plainly (``pooch``
    None) or under PoocH(**pooch) on the CPU device."""
    from pooch_ext.hooks.cpu_device import CpuDevice
    from pooch_ext.pooch import PoocH

    model, optimizer = fresh(net)
    values: list = []
    initial = model_state(model, optimizer)
    runtime, error = None, None
    with contextlib.ExitStack() as stack:
        if pooch is not None:
            runtime = stack.enter_context(PoocH(model, device=CpuDevice(), verbose=False,
                                                **pooch))
        try:
            LOOPS[loop](model, optimizer, batches(**DATA.get(net, {})), values)
        except BudgetTooSmallError as refusal:
            error = refusal
    return values, model_state(model, optimizer), initial, runtime, error
