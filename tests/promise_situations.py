"""Training situations for the promise matrix (tests/test_promise_matrix.py).

The promise: a loop run inside ``with PoocH(model, profile_iters=..., budget=..., policy=...)``
on the host-simulated device ends with bit-identical parameters, losses, BatchNormalization
running statistics and optimizer state to the same loop in plain Chainer, or it refuses with a
``pooch_ext.errors.PoochError`` (``BudgetTooSmallError`` for a budget the policy truly cannot
meet) raised before any optimizer update, with the models exactly as before the ``with`` block.

A ``Situation`` builds its models, optimizers and data (``build``, called right after
``np.random.seed(SEED)``: Chainer's initializers draw from NumPy) and returns a ``Setup`` whose
``step(i)`` runs training iteration ``i`` and returns the values the user's code would log
(losses, metrics, anything read from intermediate Variables). ``execute`` runs ``n_iters``
steps plainly or inside PoocH, with the global NumPy random state reset to ``LOOP_SEED`` first
(Dropout and lazily initialised parameters draw from it), and records what happened.

Every network is tiny (batch 4, 4-8 channels, 8x8 maps), so one run takes well under a second.
"""
from __future__ import annotations

import math
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer
import chainer.functions as F
import chainer.links as L
from chainer import optimizer_hooks, static_graph

from pooch_ext.errors import BudgetTooSmallError, PoochError
from pooch_ext.testing import model_state, states_equal
from pooch_ext.sim.budgets import fraction_between, minimum_budget

SEED, LOOP_SEED = 0, 1
PROFILE_ITERS = 2
B = 4                 # batch
C = 8                 # channels / hidden width
HW = 8                # spatial size


# ====================================================================== harness
@dataclass
class Setup:
    """What ``Situation.build`` returns: the models (by name), their optimizers (by the name of
    the model they train) and ``step(i) -> tuple`` running iteration ``i``."""

    models: dict[str, chainer.Link]
    optimizers: dict[str, chainer.Optimizer]
    step: Callable[[int], tuple]

    def state(self) -> dict:
        """Parameters, persistent values and optimizer state of every model (host copies)."""
        out = {}
        for name, model in self.models.items():
            for key, value in model_state(model, self.optimizers.get(name)).items():
                out[f"{name}:{key}"] = value
        return out


@dataclass
class Situation:
    """A training loop. ``wrap``: the model name (PoocH(model)) or a tuple of names
    (PoocH([models...])) given to PoocH. ``may_refuse``: PoocH may decline the loop as a whole
    (an unsupported feature) with any PoochError before the first update, whatever the budget.
    ``lean``: the network (and so the plans) of another situation in another loop, or one
    PoocH runs in-core only; the matrix skips pooch's second budget for it (run time)."""

    name: str
    build: Callable[[], Setup]
    wrap: str | tuple = "net"
    n_iters: int = 6
    may_refuse: bool = False
    lean: bool = False    # another situation's network: the matrix tries pooch at one budget


@dataclass
class Outcome:
    """One run: the logged values per completed iteration, the final and the initial state, the
    error (if any) with the iteration of the loop it came out of (the loop's own count, not
    PoocH's, which may see two iterations in one step of a GAN or truncated BPTT; -1: on
    entering the ``with`` block; ``n_iters``: on leaving it), where it was raised, what PoocH
    left behind in Chainer's global state (``leaks``) and, under PoocH, the PoocH object."""

    values: list = field(default_factory=list)
    state: dict = field(default_factory=dict)
    initial: dict = field(default_factory=dict)
    error: BaseException | None = None
    error_iteration: int | None = None
    where: str = ""
    pooch: Any = None
    leaks: list = field(default_factory=list)

    def describe_error(self) -> str:
        if self.error is None:
            return "no error"
        first = str(self.error).splitlines()[0] if str(self.error) else ""
        return (f"{type(self.error).__name__}: {first} (iteration {self.error_iteration}; "
                f"raised at {self.where})")


def _where(error: BaseException) -> str:
    """The innermost frame of the traceback, and the innermost one in pooch-ext if that is
    another (where PoocH's code called into Chainer or the user's code)."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return "?"

    def short(frame: traceback.FrameSummary) -> str:
        path = frame.filename
        for marker in ("/pooch_ext/", "/hooks/", "/chainer/", "/tests/"):
            if marker in path:
                path = marker.strip("/") + "/" + path.split(marker, 1)[1]
                break
        return f"{path}:{frame.lineno} in {frame.name}"

    ours = [f for f in frames if "/pooch_ext/" in f.filename or "/hooks/" in f.filename]
    where = short(frames[-1])
    if ours and ours[-1] is not frames[-1]:
        where += f" (via {short(ours[-1])})"
    return where


def _hook_tables() -> tuple[dict, dict]:
    return chainer.get_function_hooks(), chainer._get_link_hooks()


def _patch_points() -> list[tuple[Any, str]]:
    """Chainer entry points a runtime may wrap while it runs (and must put back)."""
    import chainer._backprop as backprop
    import chainer.function_node as function_node

    return [(backprop, "_backprop_to_all"), (function_node, "grad"), (chainer, "grad"),
            (chainer.Variable, "backward"), (chainer.FunctionNode, "apply"),
            (chainer.Link, "__call__")]


def execute(situation: Situation, pooch: dict | None = None, n_iters: int | None = None,
            wrap: str | tuple | None = None,
            watch: Callable[[Any], None] | None = None) -> Outcome:
    """Run the situation plainly (``pooch=None``) or inside ``PoocH(..., **pooch)``;
    ``watch(pooch)`` is called after every iteration under PoocH."""
    from pooch_ext.pooch import PoocH

    n_iters = situation.n_iters if n_iters is None else n_iters
    wrap = situation.wrap if wrap is None else wrap
    np.random.seed(SEED)
    setup = situation.build()
    outcome = Outcome(initial=setup.state())
    functions, links = (dict(t) for t in _hook_tables())
    patched = [(owner, name, owner.__dict__.get(name)) for owner, name in _patch_points()]
    config = (chainer.config.train, chainer.config.enable_backprop)
    np.random.seed(LOOP_SEED)
    i = -1
    try:
        if pooch is None:
            for i in range(n_iters):
                outcome.values.append(setup.step(i))
        else:
            target = setup.models[wrap] if isinstance(wrap, str) else \
                [setup.models[name] for name in wrap]
            outcome.error_iteration = -1
            with PoocH(target, **pooch) as runtime:
                outcome.pooch = runtime
                for i in range(n_iters):
                    outcome.values.append(setup.step(i))
                    if watch is not None:
                        watch(runtime)
                i = n_iters
    except Exception as error:  # noqa: BLE001 - judged by the caller
        outcome.error = error
        outcome.error_iteration = i
        outcome.where = _where(error)
    outcome.state = setup.state()
    # what PoocH leaves behind in Chainer's global tables would change later training
    now_functions, now_links = _hook_tables()
    for table, before, what in ((now_functions, functions, "function hook"),
                                (now_links, links, "link hook")):
        for name in [n for n in table if n not in before]:
            outcome.leaks.append(f"{what} {name!r} left installed")
            del table[name]
    for owner, name, original in patched:
        if owner.__dict__.get(name) is not original:
            outcome.leaks.append(f"{getattr(owner, '__name__', owner)}.{name} left replaced")
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
    if (chainer.config.train, chainer.config.enable_backprop) != config:
        outcome.leaks.append(f"chainer.config (train, enable_backprop) left at "
                             f"{(chainer.config.train, chainer.config.enable_backprop)}")
        chainer.config.train, chainer.config.enable_backprop = config
    return outcome


# ---------------------------------------------------------------- reference measurements
@dataclass
class Reference:
    """The quick first run: PoocH without a budget and without a policy (profiling only).

    A loop may go through several graphs (truncated BPTT's first segment starts from no
    state, a short last batch, a branch, test-mode iterations), and PoocH checks the budget on
    the first one before any update and plans the others as they come, so the reference run
    profiles every graph after one iteration (``profile_iters=1``) through all ``n_iters``
    iterations and keeps each profile PoocH built, the one it checked the budget on before the
    first update first (``PoocH.checked_profile``): ``floor`` is the largest minimum budget
    among them, ``incore`` the largest in-core need. A budget between them is one every graph
    of the loop can run in. (``pooch.profile`` is read after each of the loop's iterations, so
    a graph planned and replaced within one of them, as in truncated BPTT, is not seen.)"""

    profiles: list = field(default_factory=list)
    floor: int | None = None            # max minimum_budget(profile)
    incore: int | None = None           # max profile.incore_peak_bytes
    outcome: Outcome | None = None

    @property
    def profile(self) -> Any:
        return self.profiles[-1] if self.profiles else None

    @property
    def first_floor(self) -> int:
        """The minimum budget of the first graph: what PoocH checks before any update."""
        return int(minimum_budget(self.profiles[0]))

    @property
    def in_core_only(self) -> bool:
        """PoocH can move nothing in this loop: its minimum is the in-core need."""
        return self.floor >= self.incore

    def budget(self, fraction: float) -> int:
        """A budget ``fraction`` of the way from the minimum to the in-core need."""
        return fraction_between(self.floor, self.incore, fraction)

    def policy_fits(self, policy: str, budget: int) -> bool:
        """Whether ``policy`` has a feasible plan for ``budget`` on every graph's profile."""
        return all(policy_fits(profile, policy, budget) for profile in self.profiles)


def reference(situation: Situation, wrap: str | tuple | None = None,
              device: Any = None) -> Reference:
    """See ``Reference``; ``device``: the one PoocH runs on (None: its default)."""
    profiles: dict[int, Any] = {}

    def watch(pooch: Any) -> None:
        for profile in (pooch.checked_profile, pooch.profile):
            if profile is not None:
                profiles.setdefault(id(profile), profile)

    settings = {"profile_iters": 1, "budget": None, "policy": None, "verbose": False}
    if device is not None:
        settings["device"] = device
    outcome = execute(situation, settings, wrap=wrap, watch=watch)
    ref = Reference(outcome=outcome)
    if outcome.error is None and profiles:
        ref.profiles = list(profiles.values())
        ref.floor = max(int(minimum_budget(p)) for p in ref.profiles)
        ref.incore = max(int(p.incore_peak_bytes) for p in ref.profiles)
    return ref


def policy_fits(profile: Any, policy: str, budget: int) -> bool:
    """Whether ``policy`` has a feasible plan for ``budget`` on ``profile``."""
    from pooch_ext.policies import get_policy

    if budget < minimum_budget(profile):
        return False
    try:
        return bool(get_policy(policy).classify(profile, budget, None).feasible)
    except BudgetTooSmallError:
        return False


def moved_something(pooch: Any) -> tuple[bool, str]:
    """Whether the program the loop ended on acts (swaps, recomputes or splits convolutions)
    and an executed iteration of it did so: the policy's plan, or the swap-all program the
    profiling ran when the policy could not plan at this budget."""
    runs = pooch.iterations
    plan = pooch.plan
    program = plan.policy if plan is not None else "profile"
    executed = runs[runs.program == program]
    acted = int((executed.swap_outs + executed.recomputes + executed.splits).sum()) \
        if len(executed) else 0
    counts = dict(plan.counts) if plan is not None else "none (the policy could not plan)"
    detail = (f"plan {counts}; executed {program!r} iterations {len(executed)}, swap-outs + "
              f"recomputes + splits in them {acted}; programs {list(runs.program)}")
    planned = plan is None or (plan.counts["swap"] + plan.counts["recompute"] > 0 or
                               any(pieces > 1 for pieces in plan.configs.values()))
    return planned and acted > 0, detail


def same_values(a: list, b: list) -> bool:
    """Logged values equal bit for bit (floats compared as float64 bytes)."""
    def key(v: Any) -> Any:
        if isinstance(v, (tuple, list)):
            return tuple(key(x) for x in v)
        if isinstance(v, (float, np.floating)):
            return ("f", np.float64(v).tobytes())
        if isinstance(v, np.ndarray):
            return ("a", v.dtype.str, v.shape, v.tobytes())
        return v
    return key(a) == key(b)


def judge(situation: Situation, plain: Outcome, run: Outcome, *, budget: int | None,
          incore: int | None, refusal_justified: bool) -> str:
    """Assert the promise for one PoocH run; returns the outcome ('identical' or 'refused:
    <Error>'). ``refusal_justified``: a BudgetTooSmallError is acceptable for this budget;
    ``incore``: the reference's in-core need (below it something must have been moved)."""
    assert not run.leaks, f"PoocH left global state behind: {run.leaks}"
    if plain.error is not None:
        # plain Chainer's own error must come out of PoocH unchanged, at the same place
        assert run.error is not None and type(run.error) is type(plain.error) and \
            str(run.error) == str(plain.error), (
                f"plain Chainer raised {type(plain.error).__name__}: {plain.error}; under PoocH: "
                f"{run.describe_error()}")
        assert run.error_iteration == plain.error_iteration
        assert same_values(run.values, plain.values)
        assert states_equal(run.state, plain.state), "state differs from plain Chainer's"
        return f"plain error: {type(plain.error).__name__}"
    if run.error is not None:
        error = run.error
        clean_kind = isinstance(error, PoochError)
        assert clean_kind, f"crash: {run.describe_error()}"
        assert run.error_iteration in (-1, 0), \
            f"refusal after the first iteration: {run.describe_error()}"
        assert states_equal(run.state, run.initial), (
            f"refused ({run.describe_error()}) but the model state is not the initial one")
        allowed = situation.may_refuse or (isinstance(error, BudgetTooSmallError) and
                                           refusal_justified)
        assert allowed, (f"refused a budget the policy can meet on the reference profile: "
                         f"{run.describe_error()}")
        return f"refused: {type(error).__name__}"
    assert same_values(run.values, plain.values), (
        f"logged values differ from plain Chainer's:\n plain {plain.values}\n pooch {run.values}")
    assert states_equal(run.state, plain.state), _state_diff(plain.state, run.state)
    overruns = getattr(run.pooch, "overruns", [])
    if overruns:
        # only an iteration run on demand after the graph changed (PoocH measures the new
        # graph there, unplanned) may hold more than the budget; never a planned one
        programs = run.pooch.iterations.program
        planned = [o for o in overruns if programs.iloc[o["iteration"]] != "on-demand"
                   or o["iteration"] == 0 or not any(run.pooch.iterations.deviation)]
        assert not planned, f"the budget did not hold: {len(planned)} overruns, first {planned[0]}"
    if budget is not None and incore is not None and budget < incore:
        # the graph whose plan ran last must have had something moved if it needed more
        # than the budget (a loop's other graphs may be smaller than the largest one)
        planned = getattr(run.pooch, "profile", None)
        need = incore if planned is None else int(planned.incore_peak_bytes)
        if budget >= need:
            return "identical (the planned graph fits in-core at this budget)"
        moved, detail = moved_something(run.pooch)
        assert moved, f"bit-identical, but nothing was swapped or recomputed: {detail}"
    return "identical"


def _state_diff(expected: dict, got: dict) -> str:
    if expected.keys() != got.keys():
        return (f"state keys differ: missing {sorted(set(expected) - set(got))}, extra "
                f"{sorted(set(got) - set(expected))}")
    differ = [k for k in expected if not states_equal({k: expected[k]}, {k: got[k]})]
    return f"state differs from plain Chainer's in {len(differ)} arrays: {differ[:6]}"


# ====================================================================== data helpers
def _rng() -> np.random.RandomState:
    return np.random.RandomState(7)


def _images(rng: np.random.RandomState, n: int, batch: int = B, channels: int = 3,
            n_classes: int = 5) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(rng.rand(batch, channels, HW, HW).astype(np.float32),
             rng.randint(0, n_classes, batch).astype(np.int32)) for _ in range(n)]


def _adam() -> chainer.Optimizer:
    return chainer.optimizers.Adam(1e-3)


def _plain_step(model: chainer.Link, optimizer: chainer.Optimizer, data: list) -> Callable:
    def step(i: int) -> tuple:
        x, t = data[i]
        loss = F.softmax_cross_entropy(model(x), t)
        model.cleargrads()
        loss.backward()
        optimizer.update()
        return (float(loss.array),)
    return step


def _setup(model: chainer.Link, optimizer: chainer.Optimizer, step: Callable,
           name: str = "net") -> Setup:
    optimizer.setup(model)
    return Setup({name: model}, {name: optimizer}, step)


class ConvBN(chainer.Chain):
    """conv-BN-ReLU, max pooling, conv, Linear: the trunk of the loop variants."""

    def __init__(self, n_out: int = 5, dropout: float = 0.0) -> None:
        super().__init__()
        self.dropout = dropout
        with self.init_scope():
            self.conv1 = L.Convolution2D(3, C, 3, pad=1)
            self.bn1 = L.BatchNormalization(C)
            self.conv2 = L.Convolution2D(C, C, 3, pad=1)
            self.fc = L.Linear(C * (HW // 2) ** 2, n_out)

    def features(self, x: Any) -> chainer.Variable:
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.max_pooling_2d(h, 2)
        return F.relu(self.conv2(h))

    def forward(self, x: Any) -> chainer.Variable:
        return self.fc(self.features(x))


# ====================================================================== 1. recurrent
class LSTMNet(chainer.Chain):
    def __init__(self, vocab: int = 10) -> None:
        super().__init__()
        with self.init_scope():
            self.embed = L.EmbedID(vocab, C)
            self.lstm = L.LSTM(C, C)
            self.fc = L.Linear(C, vocab)


def _sequences(rng: np.random.RandomState, n: int, steps: int, vocab: int = 10) -> list:
    return [(rng.randint(0, vocab, (steps, B)).astype(np.int32),
             rng.randint(0, vocab, (steps, B)).astype(np.int32)) for _ in range(n)]


def build_lstm() -> Setup:
    net, data = LSTMNet(), _sequences(_rng(), 8, 4)
    optimizer = _adam()

    def step(i: int) -> tuple:
        xs, ts = data[i]
        net.lstm.reset_state()
        loss = 0
        for k in range(len(xs)):
            h = net.lstm(net.embed(xs[k]))
            loss += F.softmax_cross_entropy(net.fc(h), ts[k])
        net.cleargrads()
        loss.backward()
        optimizer.update()
        return (float(loss.array),)
    return _setup(net, optimizer, step)


class NStepNet(chainer.Chain):
    def __init__(self, vocab: int = 10) -> None:
        super().__init__()
        with self.init_scope():
            self.embed = L.EmbedID(vocab, C)
            self.rnn = L.NStepLSTM(1, C, C, 0.1)
            self.fc = L.Linear(C, vocab)
            self.head = L.Linear(C, 3)


def build_nstep_lstm() -> Setup:
    net, rng = NStepNet(), _rng()
    lengths = (4, 3, 3, 2)
    data = [([rng.randint(0, 10, n).astype(np.int32) for n in lengths],
             rng.randint(0, 10, sum(lengths)).astype(np.int32),
             rng.randint(0, 3, len(lengths)).astype(np.int32)) for _ in range(8)]
    optimizer = _adam()

    def step(i: int) -> tuple:
        xs, t, label = data[i]
        hy, _, ys = net.rnn(None, None, [net.embed(x) for x in xs])
        loss = F.softmax_cross_entropy(net.fc(F.concat(ys, axis=0)), t) + \
            F.softmax_cross_entropy(net.head(hy[-1]), label)
        net.cleargrads()
        loss.backward()
        optimizer.update()
        return (float(loss.array),)
    return _setup(net, optimizer, step)


# ====================================================================== 2. attention
class Attention(chainer.Chain):
    def __init__(self, d: int = C, steps: int = 6) -> None:
        super().__init__()
        self.d = d
        with self.init_scope():
            self.embed = L.Linear(d, d)
            self.q = L.Linear(d, d)
            self.k = L.Linear(d, d)
            self.v = L.Linear(d, d)
            self.ln1 = L.LayerNormalization(d)
            self.ffn = L.Linear(d, d)
            self.ln2 = L.LayerNormalization(d)
            self.out = L.Linear(d * steps, 3)

    def forward(self, x: Any) -> chainer.Variable:
        b, t, d = x.shape
        h = F.reshape(self.embed(F.reshape(x, (b * t, d))), (b, t, d))
        q, k, v = (f(h, n_batch_axes=2) for f in (self.q, self.k, self.v))
        scores = F.matmul(q, F.transpose(k, (0, 2, 1))) / math.sqrt(d)
        h = h + F.matmul(F.softmax(scores, axis=2), v)
        h = self.ln1(F.reshape(h, (b * t, d)))
        h = F.layer_normalization(h + F.relu(self.ffn(h)), self.ln2.gamma, self.ln2.beta)
        return self.out(F.reshape(h, (b, t * d)))


def build_attention() -> Setup:
    rng = _rng()
    data = [(rng.randn(B, 6, C).astype(np.float32), rng.randint(0, 3, B).astype(np.int32))
            for _ in range(8)]
    net, optimizer = Attention(), _adam()
    return _setup(net, optimizer, _plain_step(net, optimizer, data))


# ====================================================================== 3. convolution zoo
class ConvZoo(chainer.Chain):
    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(3, C, 3, pad=1)
            self.dilated = L.DilatedConvolution2D(C, C, 3, pad=2, dilate=2)
            self.grouped = L.Convolution2D(C, C, 3, pad=1, groups=2)
            self.deconv = L.Deconvolution2D(C, 4, 4, stride=2, pad=1)
            self.fc = L.Linear((4 + C) * (HW + 2) ** 2, 5)

    def forward(self, x: Any) -> chainer.Variable:
        h = F.leaky_relu(self.conv(x), 0.1)
        h = F.elu(self.dilated(h))
        a, b = F.split_axis(h, 2, axis=1)
        h = F.concat([F.sigmoid(a), b], axis=1)
        h = F.local_response_normalization(self.grouped(h), n=3)
        p = F.max_pooling_2d(h, 2)
        up = F.unpooling_2d(p, 2, outsize=(HW, HW))
        h = F.concat([self.deconv(p), up], axis=1)
        h = F.pad(h, ((0, 0), (0, 0), (1, 1), (1, 1)), "constant")
        return self.fc(h)


def build_conv_zoo() -> Setup:
    net, optimizer = ConvZoo(), chainer.optimizers.MomentumSGD(0.05)
    return _setup(net, optimizer, _plain_step(net, optimizer, _images(_rng(), 8)))


# ====================================================================== 4. optimizers, tied weights
class TiedNet(chainer.Chain):
    """One convolution and one Linear each used twice in a forward."""

    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.conv1 = L.Convolution2D(3, C, 3, pad=1)
            self.shared_conv = L.Convolution2D(C, C, 3, pad=1)
            self.bn = L.BatchNormalization(C)
            self.reduce = L.Linear(C * (HW // 2) ** 2, 16)
            self.shared_fc = L.Linear(16, 16)
            self.fc = L.Linear(16, 5)

    def forward(self, x: Any) -> chainer.Variable:
        h = F.relu(self.conv1(x))
        h = F.relu(self.shared_conv(h))
        h = F.relu(self.bn(self.shared_conv(h)))
        h = F.max_pooling_2d(h, 2)
        h = F.relu(self.reduce(h))
        h = F.relu(self.shared_fc(h))
        h = F.tanh(self.shared_fc(h))
        return self.fc(h)


def _tied(optimizer: chainer.Optimizer, hooks: tuple = ()) -> Callable[[], Setup]:
    def build() -> Setup:
        net = TiedNet()
        opt = optimizer()
        setup = _setup(net, opt, _plain_step(net, opt, _images(_rng(), 8)))
        for hook in hooks:
            opt.add_hook(hook())
        return setup
    return build


build_adam = _tied(lambda: chainer.optimizers.Adam(1e-3),
                   (lambda: optimizer_hooks.WeightDecay(1e-4),))
build_rmsprop = _tied(lambda: chainer.optimizers.RMSprop(1e-3))
build_momentum_hooks = _tied(lambda: chainer.optimizers.MomentumSGD(0.05),
                             (lambda: optimizer_hooks.WeightDecay(5e-4),
                              lambda: optimizer_hooks.GradientClipping(0.5)))


# ====================================================================== 5. loop variants
def build_grad_accumulation() -> Setup:
    net, optimizer, data = ConvBN(), chainer.optimizers.MomentumSGD(0.05), _images(_rng(), 8)

    def step(i: int) -> tuple:
        x, t = data[i]
        net.cleargrads()
        losses = []
        for part in (slice(0, B // 2), slice(B // 2, B)):
            loss = F.softmax_cross_entropy(net(x[part]), t[part]) / 2
            loss.backward()
            losses.append(float(loss.array))
        optimizer.update()
        return tuple(losses)
    return _setup(net, optimizer, step)


class TwoHeads(ConvBN):
    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.head_b = L.Linear(C * (HW // 2) ** 2, 3)


def build_two_heads() -> Setup:
    rng = _rng()
    net, optimizer, data = TwoHeads(), _adam(), _images(rng, 8)
    targets = [rng.randn(B, 3).astype(np.float32) for _ in range(8)]

    def step(i: int) -> tuple:
        x, t = data[i]
        h = net.features(x)
        loss_a = F.softmax_cross_entropy(net.fc(h), t)
        loss_b = F.mean_squared_error(net.head_b(h), targets[i])
        loss = loss_a + loss_b
        net.cleargrads()
        loss.backward()
        optimizer.update()
        return float(loss_a.array), float(loss_b.array)
    return _setup(net, optimizer, step)


class DropoutNet(ConvBN):
    def forward(self, x: Any) -> chainer.Variable:
        h = F.dropout(F.relu(self.bn1(self.conv1(x))), 0.2)
        h = F.dropout(F.max_pooling_2d(h, 2), 0.3)
        h = F.relu(self.conv2(h))
        return self.fc(F.dropout(h, 0.5))


def build_dropout_and_bn_test_mode() -> Setup:
    """Dropout in three places; every third iteration in test mode (no Dropout, and
    BatchNormalization with its running statistics), still with backward and update."""
    net, optimizer, data = DropoutNet(), _adam(), _images(_rng(), 8)
    train = _plain_step(net, optimizer, data)

    def step(i: int) -> tuple:
        if i % 3 == 2:
            with chainer.using_config("train", False):
                return train(i)
        return train(i)
    return _setup(net, optimizer, step)


def build_truncated_bptt() -> Setup:
    net, data = LSTMNet(), _sequences(_rng(), 8, 6)
    optimizer = _adam()

    def step(i: int) -> tuple:
        xs, ts = data[i]
        losses, loss = [], 0
        for k in range(len(xs)):
            h = net.lstm(net.embed(xs[k]))     # the state carries over between iterations
            loss += F.softmax_cross_entropy(net.fc(h), ts[k])
            if k % 3 == 2:
                net.cleargrads()
                loss.backward()
                loss.unchain_backward()
                optimizer.update()
                losses.append(float(loss.array))
                loss = 0
        return tuple(losses)
    return _setup(net, optimizer, step)


# ====================================================================== 6. graph changes
def build_partial_batch() -> Setup:
    rng = _rng()
    data = _images(rng, 5) + _images(rng, 1, batch=3)   # the last batch is short
    net, optimizer = ConvBN(), chainer.optimizers.MomentumSGD(0.05)
    return _setup(net, optimizer, _plain_step(net, optimizer, data))


class Branchy(ConvBN):
    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.extra = L.Convolution2D(C, C, 1)

    def forward(self, x: Any, branch: bool = False) -> chainer.Variable:
        h = self.features(x)
        if branch:
            h = h + F.relu(self.extra(h))
        return self.fc(h)


def build_branch(batches: int = 8) -> Setup:
    net, optimizer = Branchy(), chainer.optimizers.MomentumSGD(0.05)
    data = _images(_rng(), batches)

    def step(i: int) -> tuple:
        x, t = data[i]
        loss = F.softmax_cross_entropy(net(x, branch=i % 4 == 3), t)
        net.cleargrads()
        loss.backward()
        optimizer.update()
        return (float(loss.array),)
    return _setup(net, optimizer, step)


def build_eval_between() -> Setup:
    rng = _rng()
    net, optimizer, data = ConvBN(), _adam(), _images(rng, 8)
    x_val, t_val = _images(rng, 1)[0]
    train = _plain_step(net, optimizer, data)

    def step(i: int) -> tuple:
        loss = train(i)
        # evaluation with backprop ON (a graph is built and never backwarded)
        with chainer.using_config("train", False):
            y = net(x_val)
            accuracy = F.accuracy(y, t_val)
            val_loss = F.softmax_cross_entropy(y, t_val)
        return loss + (float(accuracy.array), float(val_loss.array))
    return _setup(net, optimizer, step)


def build_accuracy_metric() -> Setup:
    net, data = L.Classifier(ConvBN()), _images(_rng(), 8)
    optimizer = chainer.optimizers.MomentumSGD(0.05)

    def step(i: int) -> tuple:
        x, t = data[i]
        y = net.predictor(x)
        loss = F.softmax_cross_entropy(y, t)
        accuracy = F.accuracy(y, t)          # a metric from the training output, before backward
        net.cleargrads()
        loss.backward()
        optimizer.update()
        # and the Classifier's own way: optimizer.update(lossfun, *args)
        optimizer.update(net, x, t)
        return (float(loss.array), float(accuracy.array), float(net.loss.array),
                float(net.accuracy.array))
    return _setup(net, optimizer, step)


# ====================================================================== 7. GAN
class Generator(chainer.Chain):
    def __init__(self, nz: int = 8, out: int = 16) -> None:
        super().__init__()
        self.nz = nz
        with self.init_scope():
            self.l1 = L.Linear(nz, 16)
            self.bn1 = L.BatchNormalization(16)
            self.l2 = L.Linear(16, out)

    def forward(self, z: Any) -> chainer.Variable:
        return F.tanh(self.l2(F.relu(self.bn1(self.l1(z)))))


class Discriminator(chainer.Chain):
    def __init__(self, n_in: int = 16) -> None:
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(n_in, 16)
            self.bn1 = L.BatchNormalization(16)
            self.l2 = L.Linear(16, 1)

    def forward(self, x: Any) -> chainer.Variable:
        return self.l2(self.bn1(F.leaky_relu(self.l1(x), 0.2)))


def build_gan() -> Setup:
    rng = _rng()
    gen, dis = Generator(), Discriminator()
    opt_gen = chainer.optimizers.Adam(2e-4, beta1=0.5)
    opt_dis = chainer.optimizers.Adam(2e-4, beta1=0.5)
    opt_gen.setup(gen)
    opt_dis.setup(dis)
    data = [(np.tanh(rng.randn(B, 16)).astype(np.float32), rng.randn(B, 8).astype(np.float32))
            for _ in range(8)]

    def step(i: int) -> tuple:
        x_real, z = data[i]
        y_real = dis(x_real)
        x_fake = gen(z)
        y_fake = dis(x_fake)
        loss_dis = F.sum(F.softplus(-y_real)) / B + F.sum(F.softplus(y_fake)) / B
        dis.cleargrads()
        loss_dis.backward()
        opt_dis.update()
        loss_gen = F.sum(F.softplus(-y_fake)) / B
        gen.cleargrads()
        loss_gen.backward()
        opt_gen.update()
        return float(loss_dis.array), float(loss_gen.array)
    return Setup({"gen": gen, "dis": dis}, {"gen": opt_gen, "dis": opt_dis}, step)


# ====================================================================== 8. reinforcement learning
class QNet(chainer.Chain):
    def __init__(self, n_obs: int = 6, n_actions: int = 3) -> None:
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(n_obs, 16)
            self.l2 = L.Linear(16, 16)
            self.l3 = L.Linear(16, n_actions)

    def forward(self, x: Any) -> chainer.Variable:
        return self.l3(F.relu(self.l2(F.relu(self.l1(x)))))


def build_dqn() -> Setup:
    rng = _rng()
    q, target = QNet(), QNet()
    target.copyparams(q)
    optimizer = chainer.optimizers.Adam(1e-3)
    optimizer.setup(q)
    data = [(rng.randn(B, 6).astype(np.float32), rng.randn(B).astype(np.float32),
             rng.randn(B, 6).astype(np.float32)) for _ in range(8)]

    def step(i: int) -> tuple:
        obs, reward, next_obs = data[i]
        action = q(obs).array.argmax(axis=1)           # acting: a forward with backprop on
        next_q = target(next_obs).array.max(axis=1)    # the target network, backprop on too
        td_target = (reward + 0.9 * next_q).astype(np.float32)
        q_taken = F.select_item(q(obs), action)
        loss = F.mean_squared_error(q_taken, td_target)
        q.cleargrads()
        loss.backward()
        optimizer.update()
        if i % 3 == 2:
            target.copyparams(q)
        return float(loss.array), action.copy()
    return Setup({"q": q, "target": target}, {"q": optimizer}, step)


# ====================================================================== 9. static graph
class StaticNet(chainer.Chain):
    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(3, C, 3, pad=1)
            self.fc1 = L.Linear(C * (HW // 2) ** 2, 16)
            self.fc2 = L.Linear(16, 5)

    @static_graph
    def forward(self, x: Any) -> chainer.Variable:
        h = F.max_pooling_2d(F.relu(self.conv(x)), 2)
        return self.fc2(F.relu(self.fc1(h)))


def build_static_graph() -> Setup:
    net, optimizer = StaticNet(), chainer.optimizers.MomentumSGD(0.05)
    return _setup(net, optimizer, _plain_step(net, optimizer, _images(_rng(), 8)))


# ====================================================================== 10. a layer larger than the budget
class BigLayer(chainer.Chain):
    """One wide Linear whose output dwarfs everything else."""

    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(3, 4, 3, pad=1)
            self.wide = L.Linear(4 * HW * HW, 512)
            self.fc = L.Linear(512, 5)

    def forward(self, x: Any) -> chainer.Variable:
        return self.fc(F.relu(self.wide(F.relu(self.conv(x)))))


def build_big_layer() -> Setup:
    net, optimizer = BigLayer(), _adam()
    return _setup(net, optimizer, _plain_step(net, optimizer, _images(_rng(), 8)))


# ====================================================================== 11. reading intermediates
class Exposed(ConvBN):
    def forward(self, x: Any) -> tuple:
        h = self.features(x)
        return h, self.fc(h)


def build_read_intermediates() -> Setup:
    net, optimizer, data = Exposed(), _adam(), _images(_rng(), 8)

    def step(i: int) -> tuple:
        x, t = data[i]
        h, ys = net(x)
        loss = F.softmax_cross_entropy(ys, t)
        # the user's code looks at intermediate Variables between forward and backward
        logged = (float(h.array.mean()), ys.shape[0], len(ys), str(ys.dtype),
                  float(ys.array.max()), h.shape)
        net.cleargrads()
        loss.backward()
        optimizer.update()
        return (float(loss.array),) + logged
    return _setup(net, optimizer, step)


# ====================================================================== 12. two backward passes
def build_two_backwards() -> Setup:
    net, optimizer, data = Exposed(), chainer.optimizers.MomentumSGD(0.05), _images(_rng(), 8)

    def step(i: int) -> tuple:
        x, t = data[i]
        h, y = net(x)
        loss = F.softmax_cross_entropy(y, t)
        loss2 = 0.1 * F.mean(F.square(h))          # shares the graph below h
        net.cleargrads()
        loss.backward()
        loss2.backward()
        optimizer.update()
        return float(loss.array), float(loss2.array)
    return _setup(net, optimizer, step)


def build_grad_then_backward() -> Setup:
    net, optimizer, data = Exposed(), _adam(), _images(_rng(), 8)

    def step(i: int) -> tuple:
        x, t = data[i]
        h, y = net(x)
        loss = F.softmax_cross_entropy(y, t)
        gh, = chainer.grad([loss], [h])
        norm = float((gh.array.astype(np.float64) ** 2).sum())
        net.cleargrads()
        loss.backward()
        optimizer.update()
        return float(loss.array), norm
    return _setup(net, optimizer, step)


# ====================================================================== 13. double backprop
class SmoothNet(chainer.Chain):
    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(3, 4, 3, pad=1)
            self.l1 = L.Linear(4 * HW * HW, 16)
            self.l2 = L.Linear(16, 5)

    def forward(self, x: Any) -> chainer.Variable:
        return self.l2(F.tanh(self.l1(F.tanh(self.conv(x)))))


def build_gradient_penalty() -> Setup:
    net, optimizer, data = SmoothNet(), _adam(), _images(_rng(), 8)

    def step(i: int) -> tuple:
        x, t = chainer.Variable(data[i][0]), data[i][1]
        loss = F.softmax_cross_entropy(net(x), t, enable_double_backprop=True)
        gx, = chainer.grad([loss], [x], enable_double_backprop=True)
        penalty = F.sum(gx * gx)
        total = loss + 0.1 * penalty
        net.cleargrads()
        total.backward()
        optimizer.update()
        return float(loss.array), float(penalty.array)
    return _setup(net, optimizer, step)


# ====================================================================== the list
SITUATIONS = [
    Situation("lstm", build_lstm),
    Situation("nstep_lstm", build_nstep_lstm),
    Situation("attention", build_attention),
    Situation("conv_zoo", build_conv_zoo),
    Situation("tied_adam_weightdecay", build_adam),
    Situation("tied_rmsprop", build_rmsprop, lean=True),
    Situation("tied_momentum_decay_clip", build_momentum_hooks, lean=True),
    Situation("grad_accumulation", build_grad_accumulation),
    Situation("two_heads", build_two_heads),
    Situation("dropout_and_bn_test_mode", build_dropout_and_bn_test_mode),
    Situation("truncated_bptt", build_truncated_bptt),
    Situation("last_partial_batch", build_partial_batch, lean=True),
    Situation("branch_some_iters", build_branch, n_iters=8),
    Situation("eval_forward_between", build_eval_between),
    Situation("accuracy_metric", build_accuracy_metric, lean=True),
    Situation("gan_gen_and_dis", build_gan, wrap=("gen", "dis")),
    Situation("gan_gen_only", build_gan, wrap="gen"),
    Situation("dqn_target_net", build_dqn, wrap="q"),
    Situation("static_graph", build_static_graph, may_refuse=True),
    Situation("read_intermediates", build_read_intermediates),
    Situation("two_backwards", build_two_backwards, lean=True),
    Situation("grad_then_backward", build_grad_then_backward, lean=True),
    Situation("gradient_penalty", build_gradient_penalty, may_refuse=True),
]
BIG_LAYER = Situation("big_layer", build_big_layer)
BY_NAME = {s.name: s for s in SITUATIONS + [BIG_LAYER]}
