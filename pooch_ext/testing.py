"""Small training loops for comparing plain Chainer with PoocH (tests, benchmark, demo).

``train`` runs the same iterations on the same data either plainly or inside ``PoocH``; with
the same seed, plain Chainer and PoocH must end with bit-identical parameters, persistent
state and optimizer state (``model_state`` / ``states_equal``) and identical losses.
``BranchyNet`` is a tiny network holding every structure the executor has to handle.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, NamedTuple

import numpy as np

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer
import chainer.functions as F
import chainer.links as L

from pooch_ext.hooks.chainer_refs import link_hooks, optimizer_state
from pooch_ext.hooks.device import array_is_on_gpu
from pooch_ext.hooks.model_state import host_copy, persistent_values


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


class ConvNet(chainer.Chain):
    """Convolutions whose column buffers dwarf their maps, as in VGG's first layers, and
    Gist's two patterns: ReLU outputs read by a convolution or Linear and (``pool``) one read
    by max pooling; without ``pool`` every ReLU output is read by a convolution or Linear."""

    def __init__(self, n_classes: int = 5, pool: bool = True) -> None:
        super().__init__()
        self.pool = pool
        with self.init_scope():
            self.c1 = L.Convolution2D(3, 16, 3, pad=1)
            self.c2 = L.Convolution2D(16, 16, 3, pad=1)
            self.c3 = L.Convolution2D(16, 32, 3, pad=1)
            self.fc = L.Linear(None, n_classes)

    def forward(self, x: Any) -> chainer.Variable:
        h = F.relu(self.c1(x))
        h = F.relu(self.c2(h))
        if self.pool:
            h = F.max_pooling_2d(h, 2)
        return self.fc(F.relu(self.c3(h)))


class UnrolledLSTM(chainer.Chain):
    """Embedding, an LSTM over the steps of its (batch, steps) int32 input, a classifier on
    the mean of its outputs: many small ops, two outputs per step, a graph that grows with
    the sequence."""

    def __init__(self, vocab: int = 50, width: int = 256, classes: int = 10) -> None:
        super().__init__()
        with self.init_scope():
            self.embed = L.EmbedID(vocab, width)
            self.lstm = L.LSTM(width, width)
            self.fc = L.Linear(width, classes)

    def forward(self, x: Any) -> chainer.Variable:
        self.lstm.reset_state()
        hs = [self.lstm(self.embed(x[:, k])) for k in range(x.shape[1])]
        return self.fc(F.mean(F.stack(hs), axis=0))


class NStepTagger(chainer.Chain):
    """An NStepLSTM tagger over sequences of different lengths: NStepLSTM splits its carried
    state as sequences end, and the nodes of each step retain a view of part of it
    (hooks/views.py, experiments/diagnose_views.py)."""

    def __init__(self, vocab: int = 60, units: int = 96) -> None:
        super().__init__()
        with self.init_scope():
            self.embed = L.EmbedID(vocab, units)
            self.lstm = L.NStepLSTM(1, units, units, 0.0)
            self.out = L.Linear(units, vocab)

    def forward(self, xs: list) -> chainer.Variable:
        cut = np.cumsum([len(x) for x in xs[:-1]])
        _, _, ys = self.lstm(None, None, F.split_axis(self.embed(F.concat(xs, 0)), cut, 0))
        return F.softmax_cross_entropy(self.out(F.concat(ys, 0)), F.concat(xs, 0))


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
    """Per-iteration losses and times of one training run, and how it ended."""

    losses: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)       # wall time of each iteration
    cpu_seconds: list[float] = field(default_factory=list)   # process CPU time of each
    fb_seconds: list[float] = field(default_factory=list)    # forward + backward (``clock``)
    pooch: Any = None
    error: BaseException | None = None

    def step(self, model: chainer.Link, optimizer: chainer.Optimizer, x: Any, t: Any,
             sync: Any = None, clock: Any = None) -> None:
        """One iteration (forward, softmax cross entropy, backward, update), timed. ``clock()``
        makes a timer (``device.timer``) for forward + backward alone: what the simulator
        predicts, on the device's own clock (CUDA events on a GPU)."""
        wall, cpu = time.perf_counter(), time.process_time()
        timer = clock() if clock is not None else None
        if timer is not None:
            timer.start()
        loss = F.softmax_cross_entropy(model(x), t)
        model.cleargrads()
        loss.backward()
        if timer is not None:
            timer.stop()
        optimizer.update()
        self.losses.append(float(loss.array))
        del loss
        if sync is not None:
            sync()
        self.seconds.append(time.perf_counter() - wall)
        self.cpu_seconds.append(time.process_time() - cpu)
        if timer is not None:
            self.fb_seconds.append(timer.seconds())


def train(model: chainer.Link, optimizer: chainer.Optimizer, batches: Iterable,
          pooch: dict | None = None, progress: Any = None, sync: Any = None,
          clock: Any = None, after_step: Callable[[TrainResult], None] | None = None
          ) -> TrainResult:
    """One iteration per batch, plainly or (``pooch``: keyword arguments of ``PoocH``) under
    PoocH. An exception from inside the loop (BudgetTooSmallError, say) is kept in
    ``result.error`` with the losses so far. ``progress``: a tqdm bar to advance; ``sync()``
    runs before each clock read (GPU); ``clock``: see ``TrainResult.step``; ``after_step``
    is called after every iteration (e.g. to read and reset a memory peak)."""
    from pooch_ext.pooch import PoocH

    result = TrainResult()

    def loop() -> None:
        for x, t in batches:
            result.step(model, optimizer, x, t, sync, clock)
            if after_step is not None:
                after_step(result)
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


@contextmanager
def hooks_out(runtime: Any) -> Iterator[None]:
    """PoocH's function and link hooks out of Chainer's hook tables for a while: what runs
    meanwhile is plain Chainer, unobserved, and its arrays are not the device's."""
    functions, links = chainer.get_function_hooks(), link_hooks()
    saved = functions.pop(runtime.name), links.pop(runtime._link_names.name)
    paused, runtime.paused = runtime.paused, True       # its backward passes are not ours
    try:
        with runtime.device.host_side():
            yield
    finally:
        functions[runtime.name], links[runtime._link_names.name] = saved
        runtime.paused = paused


class _RandomStreams:
    """One random stream per model, both starting where the global one is now (NumPy; on the
    GPU also CuPy's, from ``seed``), so interleaved models draw the same Dropout masks."""

    def __init__(self, n: int, gpu: bool, seed: int) -> None:
        self.numpy = [np.random.get_state() for _ in range(n)]
        self.cupy = None
        if gpu:
            import cupy
            self.cupy = [cupy.random.RandomState(seed) for _ in range(n)]

    @contextmanager
    def use(self, k: int) -> Iterator[None]:
        """Draw from model ``k``'s streams inside the block; they go on where they stopped."""
        np.random.set_state(self.numpy[k])
        if self.cupy is not None:
            import cupy
            cupy.random.set_random_state(self.cupy[k])
        try:
            yield
        finally:
            self.numpy[k] = np.random.get_state()


def train_side_by_side(plain: tuple, under: tuple, batches: list, pooch: dict,
                       progress: Any = None, sync: Any = None,
                       seed: int = 0) -> tuple[TrainResult, TrainResult]:
    """Train ``plain`` = (model, optimizer) with plain Chainer and ``under`` under PoocH on the
    same batches, alternating iteration by iteration (who goes first alternates too), so that
    both see the same machine load: fair timings on a busy machine. Each model has its own
    random stream, so with equal initial weights both runs stay bit-identical."""
    from pooch_ext.pooch import PoocH

    plain_result, pooch_result = TrainResult(), TrainResult()
    gpu = bool(batches) and array_is_on_gpu(batches[0][0])
    streams = _RandomStreams(2, gpu, seed)
    try:
        with PoocH(under[0], **pooch) as context:
            pooch_result.pooch = context
            for i, (x, t) in enumerate(batches):
                for turn in ((0, 1) if i % 2 else (1, 0)):
                    with streams.use(turn):
                        if turn == 0:
                            with hooks_out(context.runtime):
                                plain_result.step(*plain, x, t, sync)
                        else:
                            pooch_result.step(*under, x, t, sync)
                if progress is not None:
                    progress.update(1)
    except Exception as error:   # noqa: BLE001 - handed to the caller
        pooch_result.error = error
    return plain_result, pooch_result


def side_by_side_figures(plain: TrainResult, under: TrainResult, plain_pair: tuple,
                         under_pair: tuple, profile_iters: int) -> dict:
    """What a ``train_side_by_side`` run shows: whether PoocH was bit-identical (losses and
    final model and optimizer state), the planned iterations' measured peak, and the median
    iteration seconds of plain Chainer after the profiled iterations and of PoocH after its
    first planned one (which still settles)."""
    executed = under.pooch.iterations.iloc[profile_iters:]
    return dict(identical=bool(plain.losses == under.losses and states_equal(
                    model_state(*plain_pair), model_state(*under_pair))),
                peak=int(executed.peak_bytes.max()),
                plain_s=float(np.median(plain.seconds[profile_iters:])),
                pooch_s=float(np.median(under.seconds[profile_iters + 1:])))


def model_state(model: chainer.Link, optimizer: chainer.Optimizer | None = None) -> dict:
    """Every array training changes: parameters, persistent state, optimizer state (host copies)."""
    state = {}
    for name, param in model.namedparams():
        state[f"param{name}"] = host_copy(param.array)
        rule = getattr(param, "update_rule", None)
        for key, value in sorted((optimizer_state(rule) or {}).items()):
            state[f"opt{name}/{key}"] = host_copy(value)
    for path, _, name, value in persistent_values(model):
        if hasattr(value, "shape"):
            state[f"persistent{path}/{name}"] = host_copy(value)
    if optimizer is not None:
        state["opt/t"] = np.asarray(optimizer.t)
    return state


def states_equal(a: dict, b: dict) -> bool:
    """Bit-identical: same keys, same dtypes, same bytes."""
    def same(x: Any, y: Any) -> bool:
        if x is None or y is None:            # an uninitialised (lazy) parameter
            return x is y
        return x.dtype == y.dtype and x.shape == y.shape and \
            np.asarray(x).tobytes() == np.asarray(y).tobytes()

    return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)


def trained(make_model: Callable[[], chainer.Link], batches: list, pooch: dict | None = None
            ) -> tuple[TrainResult, dict]:
    """A fresh ``make_model()`` (seed 0) trained with MomentumSGD on ``batches``, plainly or
    under PoocH(**pooch): its result and final state (``model_state``); raises what the run
    raised."""
    np.random.seed(0)
    model = make_model()
    optimizer = make_optimizer(model, "momentum")
    result = train(model, optimizer, batches, pooch)
    if result.error is not None:
        raise result.error
    return result, model_state(model, optimizer)


def at_first_minimum(train: Callable[..., tuple[Any, dict]], margin: float = 1.0
                     ) -> tuple[Any, int]:
    """``train(budget, pooch=True) -> (its PoocH or a null block, model_state)`` run plainly,
    at ``budget=1`` (refused: BudgetTooSmallError expected) and at the minimum that refusal
    named (times ``margin``): that run's PoocH and its budget, its training checked
    bit-identical to plain Chainer's (what the later-iteration tests check a first minimum
    by)."""
    from pooch_ext.errors import BudgetTooSmallError

    _, plain_state = train(None, pooch=False)
    try:
        train(1)
    except BudgetTooSmallError as refused:
        budget = int(refused.minimum_bytes * margin)
    else:
        raise AssertionError("budget=1 was accepted")
    pooch, state = train(budget)
    assert states_equal(state, plain_state)
    return pooch, budget


class SplitRuns(NamedTuple):
    plain: TrainResult
    plain_state: dict
    profile: Any            # the roomy run's measured Profile
    budget: int
    unsplit: int            # the smallest budget without split convolutions
    tight: TrainResult
    tight_state: dict


def where_only_splits_fit(run: Callable[[dict | None], tuple[TrainResult, dict]]) -> SplitRuns:
    """``run`` (``trained`` of one network and data) plainly, under PoocH with room (for its
    profile), and under PoocH on the CPU device within a budget halfway between the smallest
    any plan reaches with split convolutions and the smallest without: only a split plan
    fits there."""
    from pooch_ext.hooks.cpu_device import CpuDevice
    from pooch_ext.sim.budgets import minimum_budget

    plain, plain_state = run(None)
    roomy, _ = run(dict(profile_iters=3, device=CpuDevice(), verbose=False))
    profile = roomy.pooch.profile
    floor, unsplit = minimum_budget(profile), minimum_budget(profile.without_configs())
    budget = (floor + unsplit) // 2
    tight, tight_state = run(dict(profile_iters=3, device=CpuDevice(), verbose=False,
                                  budget=budget))
    return SplitRuns(plain, plain_state, profile, budget, unsplit, tight, tight_state)
