"""Small training loops for comparing plain Chainer with PoocH (tests, benchmark, demo).

``train`` runs the same iterations on the same data either plainly or inside ``PoocH``; with
the same seed, plain Chainer and PoocH must end with bit-identical parameters, persistent
state and optimizer state (``model_state`` / ``states_equal``) and identical losses.
``BranchyNet`` is a tiny network holding every structure the executor has to handle.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer
import chainer.functions as F
import chainer.links as L


class BranchyNet(chainer.Chain):
    """conv-BN-ReLU, max pooling, a concat of two conv branches, BN, a residual add, Dropout,
    conv, average pooling, Linear: every kind of node PoocH must swap or recompute exactly."""

    def __init__(self, n_classes: int = 5, width: int = 8) -> None:
        super().__init__()
        w = width
        with self.init_scope():
            self.conv1 = L.Convolution2D(3, w, 3, pad=1)
            self.bn1 = L.BatchNormalization(w)
            self.branch_a = L.Convolution2D(w, w // 2, 1)
            self.branch_b = L.Convolution2D(w, w // 2, 3, pad=1)
            self.bn2 = L.BatchNormalization(w)
            self.conv3 = L.Convolution2D(w, w, 3, pad=1)
            self.fc = L.Linear(None, n_classes)

    def forward(self, x: Any) -> chainer.Variable:
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.max_pooling_2d(h, 2)
        mixed = F.concat([self.branch_a(h), self.branch_b(h)])
        h = F.relu(self.bn2(mixed) + h)
        h = F.dropout(h, 0.3)
        h = F.relu(self.conv3(h))
        h = F.average_pooling_2d(h, 2)
        return self.fc(h)


def synthetic_batches(n: int, batch: int, shape: tuple[int, ...], n_classes: int,
                      seed: int = 1, xp: Any = np) -> list[tuple[Any, Any]]:
    """``n`` batches of uniform inputs and random labels, the same for the same seed."""
    rng = np.random.RandomState(seed)
    out = []
    for _ in range(n):
        x = rng.rand(batch, *shape).astype(np.float32)
        t = rng.randint(0, n_classes, batch).astype(np.int32)
        out.append((xp.asarray(x), xp.asarray(t)))
    return out


def make_optimizer(model: chainer.Link, name: str = "momentum") -> chainer.Optimizer:
    """An optimizer with state (MomentumSGD's velocity, Adam's moments) set up on ``model``."""
    optimizer = {"momentum": lambda: chainer.optimizers.MomentumSGD(0.05),
                 "adam": lambda: chainer.optimizers.Adam(1e-3),
                 "sgd": lambda: chainer.optimizers.SGD(0.05)}[name]()
    optimizer.setup(model)
    return optimizer


@dataclass
class TrainResult:
    losses: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)   # wall time of each iteration
    pooch: Any = None
    error: BaseException | None = None


def train(model: chainer.Link, optimizer: chainer.Optimizer, batches: Iterable,
          pooch: dict | None = None, progress: Any = None, sync: Any = None) -> TrainResult:
    """One iteration per batch: forward, softmax cross entropy, backward, update.

    ``pooch``: keyword arguments of ``PoocH`` (None: plain Chainer). An exception from inside
    the loop (BudgetTooSmallError, say) is kept in ``result.error`` with the losses so far.
    ``progress``: a tqdm bar to advance; ``sync()`` runs before each clock read (GPU).
    """
    from pooch_ext.pooch import PoocH

    result = TrainResult()

    def loop() -> None:
        for x, t in batches:
            start = time.perf_counter()
            loss = F.softmax_cross_entropy(model(x), t)
            model.cleargrads()
            loss.backward()
            optimizer.update()
            result.losses.append(float(loss.array))
            del loss
            if sync is not None:
                sync()
            result.seconds.append(time.perf_counter() - start)
            if progress is not None:
                progress.update(1)

    try:
        if pooch is None:
            loop()
        else:
            with PoocH(model, **pooch) as runtime:
                result.pooch = runtime
                loop()
    except Exception as error:   # noqa: BLE001 - handed to the caller
        result.error = error
    return result


def model_state(model: chainer.Link, optimizer: chainer.Optimizer | None = None) -> dict:
    """Every array training changes: parameters, persistent state, optimizer state (host copies)."""
    state = {}
    for name, param in model.namedparams():
        state[f"param{name}"] = chainer.backend.CpuDevice().send(param.array)
        rule = getattr(param, "update_rule", None)
        for key, value in sorted((getattr(rule, "_state", None) or {}).items()):
            state[f"opt{name}/{key}"] = chainer.backend.CpuDevice().send(value)
    for path, link in model.namedlinks():
        for name in sorted(link._persistent):
            value = link.__dict__[name]
            if hasattr(value, "shape"):
                state[f"persistent{path}/{name}"] = chainer.backend.CpuDevice().send(value)
    if optimizer is not None:
        state["opt/t"] = np.asarray(optimizer.t)
    return state


def states_equal(a: dict, b: dict) -> bool:
    """Bit-identical: same keys, same dtypes, same bytes."""
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
        and np.asarray(a[k]).tobytes() == np.asarray(b[k]).tobytes() for k in a)
