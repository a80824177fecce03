"""One measured training run, plain Chainer or under PoocH, as one row of runs.csv.

``Backend`` hides what differs between the GPU (CuPy pool limit, CUDA-event clocks, a memory
hook for the pool's real peak) and the host-simulated device (wall clock, accounted bytes),
so measure.py runs the same logic on both (``--cpu --tiny`` is how CI exercises it).

Every run starts from the same seed and trains ``profile_iters + iters`` iterations on the same
fixed batch, so its parameters can be compared bit for bit with the plain in-core run's. Times
and peaks are medians / maxima over the executed iterations after the first (warm-up) one.
"""
from __future__ import annotations

import gc
import math
import statistics
import time
import traceback
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from pooch_ext.errors import BudgetTooSmallError
from pooch_ext.hooks.device import DeviceOutOfMemoryError, EventTimer, HostSimDevice, WallTimer
from pooch_ext.hooks.pool_peak import pool_peak_hook, release_pool
from pooch_ext.testing import model_state, synthetic_batches, train
from pooch_ext.measure import setup_model
from pooch_ext.models import default_input_size, default_n_classes

HOST_NATIVE_LINK = "pcie5"   # the host-simulated device's "own" link (the GPU's is measured)

RUN_COLUMNS = (
    "model", "batch", "link", "budget_fraction", "budget_bytes", "incore_need_bytes", "policy",
    "status", "plan_feasible", "keep", "swap", "recompute", "classify_s", "iterations",
    "timed_iterations", "predicted_s", "measured_s", "time_error", "wall_s", "images_per_s",
    "predicted_peak_bytes", "measured_peak_bytes", "peak_error", "boundary_peak_bytes",
    "pool_total_peak_bytes", "arena_served", "arena_fallbacks", "room_releases",
    "params_identical", "max_abs_diff", "losses_identical", "fitted_d2h_gbps",
    "fitted_h2d_gbps", "relayouts", "on_demand", "deviation", "run_s", "error")


@dataclass(frozen=True)
class Setup:
    """What every run of one problem shares."""

    model: str
    batch: int
    profile_iters: int = 3
    iters: int = 4
    seed: int = 0
    input_size: tuple[int, ...] | None = None    # per sample; None: the model's default

    @property
    def shape(self) -> tuple[int, ...]:
        return self.input_size or default_input_size(self.model)

    @property
    def total_iters(self) -> int:
        return self.profile_iters + self.iters

    @property
    def timed(self) -> slice:
        """The iterations timed: executed ones after the first (which may still warm up)."""
        first = self.profile_iters + (1 if self.iters >= 2 else 0)
        return slice(first, self.total_iters)


class Backend:
    """The host-simulated device (CPU); GpuBackend overrides what the GPU does differently."""

    gpu = False
    oom_errors: tuple = (DeviceOutOfMemoryError,)

    def name(self) -> str:
        return "host-sim"

    def batch(self, setup: Setup) -> tuple[Any, Any]:
        return synthetic_batches(1, setup.batch, setup.shape, default_n_classes(setup.model),
                                 seed=setup.seed + 1)[0]

    def clock(self) -> Any:
        return WallTimer()

    def sync(self) -> None:
        """Nothing is asynchronous on the host."""

    def reseed(self, seed: int) -> None:
        """Random streams the run draws from besides NumPy's (``setup_model`` seeds that)."""

    def device(self, throttle: str | None) -> Any:
        return HostSimDevice(link=HOST_NATIVE_LINK, throttle=throttle)

    @contextmanager
    def peaks(self) -> Iterator[Callable[[], tuple[float, float]]]:
        """Yields ``read()``: (used, total) peak bytes since the last read (NaN on the host: it
        cannot see plain Chainer's memory; PoocH runs use the executor's accounted peaks)."""
        yield lambda: (math.nan, math.nan)

    def pool_limit(self, nbytes: int | None) -> Any:
        return nullcontext()

    def cleanup(self) -> None:
        gc.collect()


class GpuBackend(Backend):
    """The current CUDA device through CuPy."""

    gpu = True

    def __init__(self) -> None:
        import cupy
        from cupy.cuda.memory import OutOfMemoryError

        self.cupy = cupy
        self.pool = cupy.get_default_memory_pool()
        self.oom_errors = (OutOfMemoryError, DeviceOutOfMemoryError)

    def name(self) -> str:
        props = self.cupy.cuda.runtime.getDeviceProperties(self.cupy.cuda.Device().id)
        name = props["name"]
        return name.decode() if isinstance(name, bytes) else str(name)

    def batch(self, setup: Setup) -> tuple[Any, Any]:
        return tuple(self.cupy.asarray(a) for a in super().batch(setup))

    def clock(self) -> Any:
        return EventTimer(self.cupy)

    def sync(self) -> None:
        self.cupy.cuda.Device().synchronize()

    def reseed(self, seed: int) -> None:
        self.cupy.random.seed(seed)          # Dropout's masks on the GPU

    def device(self, throttle: str | None) -> Any:
        from pooch_ext.hooks.device import CupyDevice
        return CupyDevice(throttle=throttle) if throttle else None

    @contextmanager
    def peaks(self) -> Iterator[Callable[[], tuple[float, float]]]:
        hook = pool_peak_hook(self.cupy)

        def read() -> tuple[float, float]:
            peaks = float(hook.peak), float(hook.total_peak)
            hook.reset()
            return peaks

        with hook:
            hook.reset()
            yield read

    @contextmanager
    def pool_limit(self, nbytes: int | None) -> Iterator[None]:
        previous = self.pool.get_limit()
        self.pool.set_limit(size=0 if nbytes is None else int(nbytes))
        try:
            yield
        finally:
            self.pool.set_limit(size=previous)

    def cleanup(self) -> None:
        release_pool(self.cupy)


def _median(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return float(statistics.median(values)) if values else math.nan


def _max(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return float(max(values)) if values else math.nan


def _ratio_error(measured: float, predicted: float) -> float:
    return measured / predicted - 1 if predicted and predicted == predicted else math.nan


def compare_states(a: dict | None, b: dict | None) -> tuple[Any, float]:
    """(bit-identical?, largest absolute difference) of two ``model_state``s; NaN without both."""
    if a is None or b is None:
        return math.nan, math.nan
    if a.keys() != b.keys():
        return False, math.inf
    identical, largest = True, 0.0
    for key in a:
        x, y = np.asarray(a[key]), np.asarray(b[key])
        if x.shape != y.shape or x.dtype != y.dtype:
            return False, math.inf
        if x.tobytes() != y.tobytes():
            identical = False
            if x.size:
                largest = max(largest, float(np.max(np.abs(x.astype(np.float64)
                                                           - y.astype(np.float64)))))
    return identical, largest


@dataclass
class Outcome:
    """A run's row and what later runs compare against."""

    row: dict
    state: dict | None = None
    losses: list | None = None
    profile: Any = None


def run(backend: Backend, setup: Setup, *, policy: str | None, budget: int | None,
        link: str = "native", throttle: str | None = None, fraction: float = math.nan,
        incore_need: int = 0, reference: Outcome | None = None,
        predicted: tuple[float, float] | None = None, log: Callable[[str], None] = print,
        keep_profile: bool = False) -> Outcome:
    """Train ``setup`` plainly (``policy=None``, the pool limited to ``budget``) or under PoocH
    with ``policy`` and ``budget``; measure it; compare it with ``reference``. ``predicted``:
    (seconds, peak bytes) for a plain run (a PoocH run predicts its own)."""
    started = time.perf_counter()
    row = {c: math.nan for c in RUN_COLUMNS}
    row.update(model=setup.model, batch=setup.batch, link=link, budget_fraction=fraction,
               budget_bytes=budget if budget is not None else math.nan,
               incore_need_bytes=incore_need, policy=policy or "in-core (plain)",
               status="ok", error="", deviation="")
    outcome = Outcome(row)

    def attempt() -> None:
        # everything the run allocates lives in this frame, so it is gone before cleanup
        model, optimizer = setup_model(setup.model, backend.gpu, setup.seed)
        backend.reseed(setup.seed)
        batches = [backend.batch(setup)] * setup.total_iters
        pooch = None
        if policy is not None:
            pooch = {"profile_iters": setup.profile_iters, "budget": budget, "policy": policy,
                     "link": "auto", "verbose": False, "device": backend.device(throttle)}
        peaks: list[tuple[float, float]] = []
        limit = backend.pool_limit(budget) if policy is None else nullcontext()
        with limit, backend.peaks() as read_peak:
            result = train(model, optimizer, batches, pooch, sync=backend.sync,
                           clock=backend.clock, after_step=lambda _: peaks.append(read_peak()))
        _fill(row, setup, result, peaks, predicted)
        if result.error is not None:
            raise result.error
        outcome.state = model_state(model, optimizer)
        outcome.losses = list(result.losses)
        if keep_profile and result.pooch is not None:
            outcome.profile = result.pooch.profile

    try:
        attempt()
    except BudgetTooSmallError as error:
        row.update(status="does-not-fit", plan_feasible=False, error=_one_line(error))
    except backend.oom_errors as error:
        row.update(status="oom", error=_one_line(error))
        log(f"    out of memory: {_one_line(error)}")
    except Exception as error:   # noqa: BLE001 - one failed run must not stop the others
        row.update(status="error", error=_one_line(error))
        log("    " + "".join(traceback.format_exception(error)).replace("\n", "\n    "))
    if reference is not None and outcome.state is not None:
        same, largest = compare_states(reference.state, outcome.state)
        row.update(params_identical=same, max_abs_diff=largest,
                   losses_identical=reference.losses == outcome.losses)
    backend.cleanup()
    row["run_s"] = time.perf_counter() - started
    return outcome


def _one_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    return text.splitlines()[0][:300] if text else type(error).__name__


def _fill(row: dict, setup: Setup, result: Any, peaks: list[tuple[float, float]],
          predicted: tuple[float, float] | None) -> None:
    """Measured and predicted figures of a finished (or partly finished) run."""
    timed = setup.timed
    row["iterations"] = len(result.seconds)
    row["timed_iterations"] = len(result.seconds[timed])
    row["measured_s"] = _median(result.fb_seconds[timed])
    row["wall_s"] = _median(result.seconds[timed])
    row["images_per_s"] = setup.batch / row["wall_s"] if row["wall_s"] > 0 else math.nan
    row["measured_peak_bytes"] = _max([used for used, _ in peaks[timed]])
    row["pool_total_peak_bytes"] = _max([total for _, total in peaks[timed]])
    pooch = result.pooch
    if pooch is None:
        if predicted is not None:
            row["predicted_s"], row["predicted_peak_bytes"] = predicted
        row["plan_feasible"] = True
    else:
        device = pooch.device
        row["relayouts"] = getattr(device, "relayouts", math.nan)
        arena = getattr(device, "arena", None)      # the CuPy device's opt-in arena (GPU only)
        if arena is not None:
            row["arena_served"], row["arena_fallbacks"] = arena.served, arena.fallbacks
        iterations = pooch.iterations
        executed = iterations.iloc[timed] if len(iterations) else iterations
        if len(executed):
            row["boundary_peak_bytes"] = float(executed.peak_bytes.max())
            row["on_demand"] = int(executed.on_demand.sum())
            row["room_releases"] = int(executed.room_releases.sum())
            row["deviation"] = "; ".join(sorted(set(d for d in executed.deviation if d)))
            if row["measured_peak_bytes"] != row["measured_peak_bytes"]:   # host-sim: accounted
                row["measured_peak_bytes"] = row["boundary_peak_bytes"]
        plan = pooch.plan
        if plan is not None:
            row.update(plan_feasible=bool(plan.feasible), classify_s=plan.classify_seconds,
                       predicted_s=plan.iteration_time_s, predicted_peak_bytes=plan.peak_bytes,
                       **plan.counts)
        if pooch.profile is not None:
            link = pooch.profile.link
            row["fitted_d2h_gbps"] = link.d2h_bytes_per_s / 1e9
            row["fitted_h2d_gbps"] = link.h2d_bytes_per_s / 1e9
    row["time_error"] = _ratio_error(row["measured_s"], row["predicted_s"])
    row["peak_error"] = _ratio_error(row["measured_peak_bytes"], row["predicted_peak_bytes"])
