"""The measured GPU experiments of issue 6, in one process that keeps to a deadline.

    python experiments/gpu/measure.py OUT                  # on the GPU machine (run_all.sh)
    python experiments/gpu/measure.py OUT --cpu --tiny     # the same logic, host-simulated (CI)
    python experiments/gpu/measure.py OUT --report-only    # targets + figures from OUT's CSVs

1. **Links** (link.csv): copies of 1-256 MiB through the executor's own path
   (``CupyDevice.swap_out`` / ``swap_in``), natively and throttled to ``--emulate`` (pcie3),
   achieved GB/s against the preset's; every copy is checked to come back bit-identical.
2. **Measured profiles** (profiles.csv, profiles/<name>/): each network trained a few
   iterations with every feature map swapped, the memory pool limited to a 16 GB V100
   (``MemoryPool.set_limit``), and, for ``--emulate-model``, once more on copy streams
   throttled to ``--emulate``. Beside each: what pooch and superneurons would decide on it at
   the smallest budget (the paper's Table 3 question: does a slower link make pooch recompute
   more?).
3. **Real runs** (runs.csv): plain Chainer (in-core, pool limited to the V100's capacity), then
   PoocH with each policy at each budget fraction of the in-core need (the pool's peak total
   bytes in the plain run: what a limit has to allow; the profile's prediction if that run
   failed); for ``--emulate-model`` again on the throttled link at the smallest budget. Each row holds
   images/s, the simulator's prediction beside the measured forward + backward time (CUDA
   events) and peak (a pool memory hook), out-of-memory or not, and whether the parameters after
   the last iteration are bit-identical to the plain run's.
4. **Report** (targets.csv, throughput.png, fidelity.png, link.png): report.py.

Every row is written as soon as its run ends, and a run that would not finish before
``--deadline-s`` is recorded as skipped, so a slow machine yields a partial table, not none.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: common.py
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import pooch_ext  # noqa: E402,F401  (chainer import compat)
import report  # noqa: E402
from pooch_ext.units import format_bytes  # noqa: E402
from runner import RUN_COLUMNS, Backend, GpuBackend, Outcome, Setup, run  # noqa: E402

V100_GPU = "v100-16gb"
POLICIES = ("pooch", "superneurons", "swap-all")   # in order of importance (the deadline)
PROFILE_COLUMNS = ("name", "model", "batch", "link", "pool_limit_bytes", "incore_peak_bytes",
                   "minimum_bytes", "feature_map_bytes", "resident_bytes", "forward_s",
                   "backward_s", "fitted_d2h_gbps", "fitted_h2d_gbps", "decide_fraction",
                   "pooch_keep", "pooch_swap", "pooch_recompute", "pooch_predicted_s",
                   "superneurons_keep", "superneurons_swap", "superneurons_recompute",
                   "superneurons_predicted_s", "profile_s")


@dataclass
class Config:
    """What to measure; ``gpu_config`` / ``tiny_config`` are the two presets."""

    problems: list[tuple[str, int]]
    profile_iters: int
    iters: int
    fractions: list[float]
    policies: list[str]
    emulate: str | None
    emulate_model: str | None
    emulate_policies: list[str]
    copy_mib: list[int] = field(default_factory=lambda: [1, 8, 64, 256])
    input_size: tuple[int, ...] | None = None
    model_fractions: dict[str, list[float]] = field(default_factory=dict)   # overrides
    reserve_s: float = 30.0        # a network is not started with less time left than this

    def fractions_of(self, model: str) -> list[float]:
        return self.model_fractions.get(model, self.fractions)


def gpu_config() -> Config:
    # ResNet-50 at batch 160 needs ~12.6 GiB in core without cuDNN (im2col, the analytic
    # profile): inside the emulated 16 GB V100 with room for error, so in-core runs there, and
    # 1/2 and 1/3 of it are 2x and 3x larger problems than the memory.
    # small-resnet cannot go below ~45% of its in-core need (its full-resolution blocks)
    return Config([("small-resnet", 256), ("resnet50", 160)], 3, 4, [1.0, 1 / 2, 1 / 3],
                  list(POLICIES), "pcie3", "resnet50", list(POLICIES),
                  model_fractions={"small-resnet": [1.0, 0.6]})


def tiny_config() -> Config:
    # small-resnet b8 at 16x16 on the CPU device, memory measured (im2col scratch included),
    # cannot go below ~80% of its in-core need, superneurons not below ~90%: budgets 1x, 0.9x
    return Config([("small-resnet", 8)], 2, 1, [1.0, 0.9], list(POLICIES), "pcie3",
                  "small-resnet", ["pooch"], [1, 4], (3, 16, 16), reserve_s=0.0)


class Clock:
    """Seconds since start, the deadline, and log lines stamped with both."""

    def __init__(self, deadline_s: float) -> None:
        self.start = time.perf_counter()
        self.deadline_s = deadline_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.deadline_s - self.elapsed()

    def log(self, message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')} +{self.elapsed():6.1f}s] {message}", flush=True)


class Estimate:
    """How long a run takes: the longest one seen so far, or a first guess before any."""

    def __init__(self, guess_s: float) -> None:
        self.guess_s, self.seen = guess_s, []

    @property
    def seconds(self) -> float:
        return max(self.seen) if self.seen else self.guess_s

    def add(self, seconds: float) -> None:
        self.seen.append(seconds)


class Table:
    """A CSV that grows by one row at a time (rewritten whole: tables are small)."""

    def __init__(self, path: Path, columns: tuple[str, ...]) -> None:
        self.path, self.columns, self.rows = path, columns, []

    def add(self, row: dict) -> None:
        self.rows.append({c: row.get(c, math.nan) for c in self.columns})
        pd.DataFrame(self.rows, columns=list(self.columns)).to_csv(self.path, index=False)


# ---------------------------------------------------------------------------------- stages

def _link_name(throttle: str | None) -> str:
    return f"{throttle}-emulated" if throttle else "native"


def _size(nbytes: float) -> str:
    return format_bytes(int(nbytes)) if nbytes == nbytes else "n/a"


def calibrate_links(backend: Backend, cfg: Config, out: Path, clock: Clock) -> None:
    """Copies through swap_out / swap_in, native and throttled: link.csv."""
    from pooch_ext.hooks.device import round_trip
    from pooch_ext.hooks.linkemu import copy_s

    xp = backend.cupy if backend.gpu else np
    rows = []
    for name, throttle in (("native", None), (f"{cfg.emulate}-emulated", cfg.emulate)):
        if name != "native" and not cfg.emulate:
            continue
        device = backend.device(throttle)
        if device is None:                       # GPU, native: a plain CupyDevice
            from pooch_ext.hooks.device import CupyDevice
            device = CupyDevice()
        for mib in cfg.copy_mib:
            data = xp.arange(mib * 2**18, dtype=np.float32)
            times = {"d2h": [], "h2d": []}
            exact = True
            for _ in range(3):
                out_s, in_s, back = round_trip(device, data)
                exact &= bool(xp.array_equal(back, data))
                times["d2h"].append(out_s)
                times["h2d"].append(in_s)
                del back
            for direction, values in times.items():
                seconds = float(np.median(values))
                target = copy_s(throttle, direction, data.nbytes) if throttle else math.nan
                rows.append(dict(link=name, emulates=throttle or "", direction=direction,
                                 bytes=int(data.nbytes), seconds=seconds,
                                 gbps=data.nbytes / seconds / 1e9 if seconds > 0 else math.nan,
                                 target_s=target,
                                 target_gbps=data.nbytes / target / 1e9 if throttle else math.nan,
                                 exact=exact))
            del data
        device.restore()
        del device
        backend.cleanup()
    table = pd.DataFrame(rows)
    table.to_csv(out / "link.csv", index=False)
    for (name, direction), part in table.groupby(["link", "direction"], sort=False):
        big = part.iloc[-1]
        clock.log(f"link {name} {direction}: {big.gbps:.1f} GB/s at {big.bytes / 2**20:.0f} MiB"
                  + (f" (preset {big.target_gbps:.1f})" if big.target_gbps == big.target_gbps
                     else "") + ("" if part.exact.all() else "  COPIES NOT EXACT"))


def profile_stage(backend: Backend, setup: Setup, cfg: Config, throttle: str | None,
                  out: Path, table: Table, clock: Clock):
    """The measured profile at the V100's capacity, saved, and what two policies make of it."""
    from pooch_ext.analytic.costmodel import get_gpu
    from pooch_ext.measure import measured_profile
    from pooch_ext.policies import get_policy
    from pooch_ext.sim.budgets import minimum_budget

    link = _link_name(throttle)
    name = f"{setup.model}_b{setup.batch}_{link}"
    limit = get_gpu(V100_GPU).capacity_bytes
    started = time.perf_counter()
    profile = measured_profile(setup.model, setup.batch, setup.input_size, budget=limit,
                               iters=setup.profile_iters, gpu=backend.gpu,
                               device=backend.device(throttle))
    backend.cleanup()
    profile.save(out / "profiles" / name)
    fraction = min(cfg.fractions_of(setup.model))
    budget = int(fraction * profile.incore_peak_bytes)
    row = dict(name=name, model=setup.model, batch=setup.batch, link=link, pool_limit_bytes=limit,
               incore_peak_bytes=profile.incore_peak_bytes, minimum_bytes=minimum_budget(profile),
               feature_map_bytes=profile.feature_map_bytes,
               resident_bytes=int(profile.summary()["resident_bytes"]),
               forward_s=float(profile.forward_ops.duration_s.sum()),
               backward_s=float(profile.backward_ops.duration_s.sum()),
               fitted_d2h_gbps=profile.link.d2h_bytes_per_s / 1e9,
               fitted_h2d_gbps=profile.link.h2d_bytes_per_s / 1e9, decide_fraction=fraction,
               profile_s=time.perf_counter() - started)
    for policy in ("pooch", "superneurons"):
        try:
            plan = get_policy(policy).classify(profile, budget, None)
            row.update({f"{policy}_{k}": v for k, v in plan.counts.items()})
            row[f"{policy}_predicted_s"] = plan.iteration_time_s if plan.feasible else math.nan
        except Exception as error:   # noqa: BLE001 - a budget below the minimum, say
            clock.log(f"  {policy} at {fraction:.2g}x: {type(error).__name__}: {error}")
    table.add(row)
    clock.log(f"profile {name}: in-core {format_bytes(profile.incore_peak_bytes)}, minimum "
              f"{format_bytes(row['minimum_bytes'])}, forward+backward "
              f"{(row['forward_s'] + row['backward_s']) * 1e3:.1f} ms, link fitted "
              f"{row['fitted_d2h_gbps']:.1f}/{row['fitted_h2d_gbps']:.1f} GB/s, in "
              f"{row['profile_s']:.1f} s; pooch at {fraction:.2g}x keeps/swaps/recomputes "
              f"{row.get('pooch_keep')}/{row.get('pooch_swap')}/{row.get('pooch_recompute')}")
    return profile


def one_run(backend: Backend, setup: Setup, profile, runs: Table, clock: Clock,
            estimate: Estimate, *, policy: str | None, budget: int | None, need: int,
            throttle: str | None = None, fraction: float = math.nan,
            reference: Outcome | None = None) -> Outcome | None:
    """One row of runs.csv: the run, or 'skipped' when it would end after the deadline."""
    link = _link_name(throttle)
    label = (f"{setup.model} b{setup.batch} {link} {policy or 'in-core (plain)'}"
             + (f" at {fraction:.2g}x" if fraction == fraction else "")
             + (f" = {format_bytes(budget)}" if budget is not None else " without a limit"))
    if clock.left() < 1.2 * estimate.seconds:
        clock.log(f"skip {label}: {clock.left():.0f} s left, a run takes "
                  f"~{estimate.seconds:.0f} s")
        runs.add(dict(model=setup.model, batch=setup.batch, link=link,
                      policy=policy or "in-core (plain)", budget_fraction=fraction,
                      budget_bytes=budget, incore_need_bytes=need, status="skipped",
                      error="deadline"))
        return None
    clock.log(f"run {label}")
    predicted = (profile.incore_time_s, float(profile.incore_peak_bytes))
    outcome = run(backend, setup, policy=policy, budget=budget, link=link, throttle=throttle,
                  fraction=fraction, incore_need=need, reference=reference,
                  predicted=predicted if policy is None else None, log=clock.log)
    row = outcome.row
    runs.add(row)
    estimate.add(row["run_s"])
    clock.log(f"  {row['status']}: {row['images_per_s']:.1f} img/s, fwd+bwd "
              f"{row['measured_s'] * 1e3:.1f} ms (predicted {row['predicted_s'] * 1e3:.1f}), "
              f"peak {_size(row['measured_peak_bytes'])} (predicted "
              f"{_size(row['predicted_peak_bytes'])}), classes "
              f"{row['keep']}/{row['swap']}/{row['recompute']}, params identical "
              f"{row['params_identical']}, {row['run_s']:.1f} s"
              + (f" [{row['error']}]" if row["error"] else ""))
    return outcome


def plain_stage(backend: Backend, setup: Setup, profile, runs: Table, clock: Clock,
                estimate: Estimate) -> tuple[Outcome | None, int]:
    """Plain Chainer in core, the pool limited to the V100's capacity (and, if it does not fit
    there, again without a limit: its speed is still the yardstick, like the paper's hollow
    points). Returns the reference run and the in-core need the budgets are fractions of: the
    pool's peak total bytes in that run (what a limit has to allow), else the profile's
    prediction."""
    from pooch_ext.analytic.costmodel import get_gpu

    need = int(profile.incore_peak_bytes)
    reference = None
    for budget in (get_gpu(V100_GPU).capacity_bytes, None):
        outcome = one_run(backend, setup, profile, runs, clock, estimate, policy=None,
                          budget=budget, need=need)
        if outcome is None:
            break
        if outcome.state is not None:
            reference = outcome
            measured = outcome.row["pool_total_peak_bytes"]
            if measured == measured and measured > 0:
                need = int(measured)
            break
        if outcome.row["status"] != "oom":
            break
    return reference, need


def runs_stage(backend: Backend, setup: Setup, profile, throttle: str | None,
               reference: Outcome | None, need: int, runs: Table, clock: Clock,
               estimate: Estimate, fractions: list[float], policies: list[str]) -> None:
    """PoocH at each budget fraction of ``need`` with each policy."""
    for fraction in fractions:
        for policy in policies:
            one_run(backend, setup, profile, runs, clock, estimate, policy=policy,
                    budget=int(fraction * need), need=need, throttle=throttle,
                    fraction=fraction, reference=reference)


def measure_problem(backend: Backend, cfg: Config, setup: Setup, out: Path, profiles: Table,
                    runs: Table, clock: Clock) -> None:
    """One network, most important first (a deadline cuts the rest): its profile, in-core,
    every policy at the smallest budget, the emulated link there, then the larger budgets."""
    def profiled(throttle: str | None):
        try:
            return profile_stage(backend, setup, cfg, throttle, out, profiles, clock)
        except Exception as error:   # noqa: BLE001 - the next problem may still run
            clock.log(f"profile {setup.model} b{setup.batch} ({_link_name(throttle)}) failed: "
                      f"{type(error).__name__}: {error}")
            backend.cleanup()
            return None

    native = profiled(None)
    if native is None:
        return
    # first guess: the profiling run (every map swapped) stretched to a run's iterations
    estimate = Estimate(profiles.rows[-1]["profile_s"] * setup.total_iters / setup.profile_iters)
    fractions = sorted(cfg.fractions_of(setup.model))
    reference, need = plain_stage(backend, setup, native, runs, clock, estimate)
    clock.log(f"in-core need of {setup.model} b{setup.batch}: {format_bytes(need)} "
              f"(the profile predicted {format_bytes(native.incore_peak_bytes)})")
    runs_stage(backend, setup, native, None, reference, need, runs, clock, estimate,
               fractions[:1], cfg.policies)
    if cfg.emulate and setup.model == cfg.emulate_model and clock.left() > 2 * estimate.seconds:
        emulated = profiled(cfg.emulate)
        if emulated is not None:
            runs_stage(backend, setup, emulated, cfg.emulate, reference, need, runs, clock,
                       estimate, fractions[:1], cfg.emulate_policies)
    runs_stage(backend, setup, native, None, reference, need, runs, clock, estimate,
               fractions[1:], cfg.policies)


# ---------------------------------------------------------------------------------- main

def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="output folder")
    parser.add_argument("--cpu", action="store_true", help="host-simulated device, no CuPy")
    parser.add_argument("--tiny", action="store_true",
                        help="small-resnet, batch 8 of 16x16 inputs, 3 iterations per run")
    parser.add_argument("--report-only", action="store_true",
                        help="only rebuild targets.csv and the figures from OUT's CSVs")
    parser.add_argument("--deadline-s", type=float, default=420.0,
                        help="stop starting runs that would end after this (default 420)")
    parser.add_argument("--problems", default=None,
                        help="model:batch,... (default small-resnet:256,resnet50:160)")
    parser.add_argument("--iters", type=int, default=None, help="executed iterations per run")
    parser.add_argument("--emulate", default=None, help="link preset to throttle to (pcie3)")
    parser.add_argument("--no-splits", action="store_true",
                        help="PoocH without split convolutions: no convolution call is offered "
                             "for splitting (measuring splits on probes took over 7 minutes "
                             "for ResNet-50 b160 on an H100)")
    return parser.parse_args(argv)


def _config(args: argparse.Namespace) -> Config:
    cfg = tiny_config() if args.tiny else gpu_config()
    if args.problems:
        cfg.problems = [(m, int(b)) for m, b in (p.split(":") for p in args.problems.split(","))]
    if args.iters is not None:
        cfg.iters = args.iters
    if args.emulate is not None:
        cfg.emulate = None if args.emulate == "none" else args.emulate
    return cfg


def _environment(backend: Backend, cfg: Config) -> dict:
    import chainer

    env = {"device": backend.name(), "python": sys.version.split()[0],
           "numpy": np.__version__, "chainer": chainer.__version__, "pandas": pd.__version__,
           "config": {k: v for k, v in vars(cfg).items()}}
    if backend.gpu:
        import cupy
        env.update(cupy=cupy.__version__, cuda_runtime=cupy.cuda.runtime.runtimeGetVersion(),
                   cuda_driver=cupy.cuda.runtime.driverGetVersion(),
                   chainer_cuda_available=bool(chainer.backends.cuda.available),
                   chainer_cudnn_enabled=bool(chainer.backends.cuda.cudnn_enabled),
                   memory_total_bytes=int(cupy.cuda.runtime.memGetInfo()[1]))
    return env


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.no_splits:
        from pooch_ext.hooks import profiler
        profiler.conv_call = lambda function, in_data: None
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        report.write_all(out)
        return 0
    cfg = _config(args)
    clock = Clock(args.deadline_s)
    backend = Backend() if args.cpu else GpuBackend()
    env = _environment(backend, cfg)
    (out / "environment.json").write_text(json.dumps(env, indent=2, default=str))
    clock.log(f"device {env['device']}; deadline {args.deadline_s:.0f} s; {json.dumps(env)}")

    try:
        calibrate_links(backend, cfg, out, clock)
    except Exception as error:   # noqa: BLE001 - the runs are worth having anyway
        clock.log(f"link calibration failed: {type(error).__name__}: {error}")
        backend.cleanup()
    profiles = Table(out / "profiles.csv", PROFILE_COLUMNS)
    runs = Table(out / "runs.csv", RUN_COLUMNS)
    for model, batch in cfg.problems:
        if clock.left() < cfg.reserve_s:
            clock.log(f"skip {model}: {clock.left():.0f} s left")
            runs.add(dict(model=model, batch=batch, link="native", policy="(all)",
                          status="skipped", error="deadline before its profile"))
            continue
        measure_problem(backend, cfg, Setup(model, batch, cfg.profile_iters, cfg.iters,
                                            input_size=cfg.input_size),
                        out, profiles, runs, clock)
    clock.log("report")
    report.write_all(out)
    clock.log(f"done in {clock.elapsed():.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
