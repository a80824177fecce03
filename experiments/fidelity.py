"""The simulator's fidelity: predicted against measured iteration time and peak, on the CPU device.

For each network x link x policy x budget, a fresh model trains under
``PoocH(policy, budget, device=CpuDevice(link))`` (profiling included: the profile, the plan
and the run are all real); the plan's predicted forward+backward time and peak are compared
with the medians of the planned iterations' measured forward+backward time (the device's clock)
and their measured peak (the counting allocator). Networks: small-resnet (residual CNN),
BranchyNet (concat, BatchNorm, Dropout, pooling) and an unrolled LSTM. Budgets are fractions of
the way from the network's minimum to its in-core need, both measured first. Each cell runs
``--repeats`` times (interleaved, each run profiling and planning afresh); its figures are the
medians over its runs, and the report gives the run-to-run spread of the measured time (an
LSTM iteration of 40 ms varies by 10-20% between identical runs on a 2-core VM). Links: the CPU
device's ``cpu`` preset (copies about as long as the compute, like PCIe on a GPU) and
``cpu-fast`` (6x faster, like NVLink). ``--device cupy`` runs the same grid on the GPU with the
CuPy device instead, over its own link (``native``) and throttled to ``pcie3``, the model and
batches on the GPU, times from CUDA events and peaks from a pool hook (inside ops too); it
refuses with one line where CUDA is absent (no GPU has been lent to the project yet:
experiments/gpu/measure.py is the fuller GPU-side comparison).

    OPENBLAS_NUM_THREADS=1 python experiments/fidelity.py [--quick] [--network lstm]
        [--repeats 3] [--out results/fidelity] [--device cpu|cupy]
        [--report: print the saved CSV's report again, no runs]

Writes fidelity.csv (one row per run, ``repeat`` numbering a cell's runs), fidelity.png
(predicted vs measured, time and peak, one point per cell) and prints the errors against the
targets and the measured policy ordering per budget.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "results" / "fidelity"
POLICIES = ["pooch", "swap-all", "superneurons", "sqrt-n"]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="one network, one link, two policies, one budget (a smoke test)")
    parser.add_argument("--network", action="append", default=None,
                        help="only this network (repeatable): small-resnet, branchy, lstm")
    parser.add_argument("--iters", type=int, default=6, help="planned iterations per run")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs per cell (each profiles and plans afresh); a cell's figures "
                             "are the medians over its runs")
    parser.add_argument("--profile-iters", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--device", choices=["cpu", "cupy"], default="cpu",
                        help="cpu: the CPU device, links cpu and cpu-fast (emulated); cupy: "
                             "the GPU, its own link and pcie3 (throttled)")
    parser.add_argument("--report", action="store_true",
                        help="print the report of the fidelity.csv in --out again (no runs)")
    return parser.parse_args(argv)


def _networks(quick: bool) -> dict:
    """name -> (make model, make batches(n))."""
    import numpy as np

    from pooch_ext.testing import BranchyNet, UnrolledLSTM, synthetic_batches
    from pooch_ext.models import get_model

    def sequences(n: int, batch: int = 32, steps: int = 12) -> list:
        rng = np.random.RandomState(1)
        return [(rng.randint(0, 50, (batch, steps)).astype(np.int32),
                 rng.randint(0, 10, batch).astype(np.int32)) for _ in range(n)]

    nets = {"small-resnet b16": (lambda: get_model("small-resnet"),
                                 lambda n: synthetic_batches(n, 16, (3, 32, 32), 10)),
            "branchy b32": (lambda: BranchyNet(width=32),
                            lambda n: synthetic_batches(n, 32, (3, 32, 32), 5)),
            "lstm b32x12": (UnrolledLSTM, sequences)}
    return dict(list(nets.items())[:1]) if quick else nets


def _run(make, batches, policy, budget, link, profile_iters, gpu=None):
    """One training run under PoocH: (pooch, result, the pool's peak bytes per iteration on
    the GPU, else []). ``gpu``: the cupy module (the CuPy device; ``link`` None is the GPU's
    own, a preset throttles to it), else the CPU device, whose iterations record their peaks."""
    from contextlib import nullcontext

    import numpy as np

    from pooch_ext.testing import make_optimizer, train

    np.random.seed(0)
    model = make()
    if gpu is not None:
        gpu.random.seed(0)
        model.to_gpu()
        batches = [(gpu.asarray(x), gpu.asarray(t)) for x, t in batches]
    device, sync, hook = _device(link, gpu)
    optimizer = make_optimizer(model, "momentum")
    peaks: list[int] = []

    def pool_peak(_) -> None:      # the GPU: the pool's peak of each iteration, inside ops too
        peaks.append(int(hook.peak))
        hook.reset()

    with hook if hook is not None else nullcontext():
        result = train(model, optimizer, batches,
                       {"profile_iters": profile_iters, "policy": policy, "budget": budget,
                        "verbose": False, "device": device}, clock=device.timer, sync=sync,
                       after_step=pool_peak if hook is not None else None)
    return result.pooch, result, peaks


def _device(link, gpu) -> tuple:
    """(device, synchronize or None, pool peak hook or None): the CuPy device throttled to
    ``link`` (None: the GPU's own) where ``gpu`` is the cupy module, else the CPU device."""
    from pooch_ext.hooks.cpu_device import CpuDevice
    from pooch_ext.hooks.device import CupyDevice
    from pooch_ext.hooks.pool_peak import pool_peak_hook

    if gpu is None:
        return CpuDevice(link=link), None, None
    return CupyDevice(throttle=link), gpu.cuda.Device().synchronize, pool_peak_hook(gpu)


def _links(device: str) -> tuple[dict, object]:
    """(link name -> what ``_run`` takes, the cupy module or None) for ``--device``."""
    from pooch_ext.links import Link, get_link

    if device == "cupy":
        try:
            import cupy

            if cupy.cuda.runtime.getDeviceCount() < 1:
                raise RuntimeError("no CUDA device")
        except Exception as error:   # noqa: BLE001 - any reason CuPy cannot run here
            raise SystemExit(f"fidelity.py: --device cupy needs CuPy and a CUDA GPU "
                             f"({type(error).__name__}: {error})") from None
        return {"native": None, "pcie3": "pcie3"}, cupy
    cpu = get_link("cpu")
    return {"cpu": cpu, "cpu-fast": Link("cpu-fast", 6 * cpu.d2h_bytes_per_s,
                                         6 * cpu.h2d_bytes_per_s, cpu.latency_s)}, None


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    import numpy as np
    import pandas as pd
    from tqdm import tqdm

    if args.report:
        report(pd.read_csv(args.out / "fidelity.csv"), args.out)
        return 0
    import pooch_ext  # noqa: F401
    from pooch_ext.sim.budgets import budget_between, minimum_budget

    links, gpu = _links(args.device)
    if args.quick:
        links = dict(list(links.items())[:1])
    policies = POLICIES[:2] if args.quick else POLICIES
    fractions = [0.5] if args.quick else [0.1, 0.5, 0.9]
    nets = _networks(args.quick)
    if args.network:
        nets = {name: net for name, net in nets.items()
                if any(name.startswith(wanted) for wanted in args.network)}
        if not nets:
            raise SystemExit(f"no network among {', '.join(_networks(False))} starts with "
                             f"{', '.join(args.network)}")
    n = args.profile_iters + args.iters
    repeats = 1 if args.quick else args.repeats
    bar = tqdm(total=len(nets) * len(links) * (1 + repeats * len(policies) * len(fractions)),
               desc="fidelity", file=sys.stderr)
    cells = []       # (net, make, batches, link name, link, fraction, budget, minimum, in-core)
    for net, (make, make_batches) in nets.items():
        batches = make_batches(n)
        for link_name, link in links.items():
            probe, _, _ = _run(make, batches[:args.profile_iters], None, None, link,
                               args.profile_iters, gpu)
            low, high = minimum_budget(probe.profile), probe.profile.incore_peak_bytes
            bar.update(1)
            cells += [(net, make, batches, link_name, link, fraction,
                       budget_between(probe.profile, fraction), low, high)
                      for fraction in fractions]
            del probe
            _clean(gpu)
    rows = []
    for repeat in range(repeats):       # repeats interleaved: a slow spell hits every cell
        for net, make, batches, link_name, link, fraction, budget, low, high in cells:
            for policy in policies:
                pooch, result, peaks = _run(make, batches, policy, budget, link,
                                            args.profile_iters, gpu)
                bar.update(1)
                row = dict(network=net, link=link_name, policy=policy, fraction=fraction,
                           repeat=repeat, budget_bytes=budget, minimum_bytes=low,
                           incore_bytes=high)
                plan = pooch.plan if pooch is not None else None
                if result.error is not None or plan is None:
                    row.update(status=f"{type(result.error).__name__}: {result.error}"
                               if result.error else "no plan")
                    rows.append(row)
                    _say_unexpected(result.error, row)
                    del pooch, result, peaks
                    _clean(gpu)
                    continue
                planned = pooch.iterations.iloc[args.profile_iters:]
                row.update(pooch_predicted_s=_pooch_on(pooch.profile, budget, plan))
                row.update(status="ok", keep=plan.counts["keep"], swap=plan.counts["swap"],
                           recompute=plan.counts["recompute"],
                           predicted_s=plan.iteration_time_s,
                           measured_s=float(np.median(result.fb_seconds[args.profile_iters:])),
                           predicted_peak=plan.peak_bytes,
                           measured_peak=(max(peaks[args.profile_iters:]) if peaks
                                          else int(planned.peak_bytes.max())),
                           overruns=len(pooch.overruns))
                rows.append(row)
                del pooch, result, peaks, planned, plan
                _clean(gpu)
    bar.close()
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "fidelity.csv", index=False)
    report(frame, args.out)
    return 0


KEYS = ["network", "link", "policy", "fraction"]


def _clean(gpu) -> None:
    """Between runs on a GPU: the last run's arrays out of the pool (its cyclic garbage
    collected, its cached blocks handed back), so the next run's pool limit and peak count
    that run alone. A first GPU run of this script held the previous run while the next ran:
    measured peaks 2x the budget, and out-of-memory errors with 25 MB held under a 9 MB limit."""
    from pooch_ext.hooks.pool_peak import release_pool

    if gpu is not None:
        release_pool(gpu)


def _say_unexpected(error: BaseException | None, row: dict) -> None:
    """A failure that is not a PoocH refusal gets its traceback in the log (the CSV keeps one
    line)."""
    import traceback

    from tqdm import tqdm

    from pooch_ext.errors import PoochError

    if error is None or isinstance(error, PoochError):
        return
    where = ", ".join(f"{key} {row[key]}" for key in KEYS)
    tqdm.write(f"{where}: " + "".join(traceback.format_exception(error)).rstrip(), file=sys.stderr)


def _pooch_on(profile, budget: int, plan) -> float:
    """pooch's predicted time on the profile this run measured: each run profiles afresh,
    and two runs' profiles differ by more than two policies' plans do, so policies are
    compared on one profile."""
    from pooch_ext.policies import get_policy

    if plan.policy == "pooch":
        return plan.iteration_time_s
    pooch = get_policy("pooch").classify(profile, budget, None)
    return pooch.iteration_time_s if pooch.feasible else float("nan")


FIGURES = ("predicted_s", "measured_s", "predicted_peak", "measured_peak")


def _with_figures(frame):
    """The frame with every figure column, empty where no run of it was ok."""
    return frame.reindex(columns=list(dict.fromkeys([*frame.columns, *FIGURES])))


def cells_of(frame):
    """One row per cell that planned and ran in every run: the medians of its runs, the
    budget, how many runs and the spread of their measured times (max / min - 1)."""
    frame = _with_figures(frame)
    cell = frame.set_index(KEYS).index
    columns = list(FIGURES)
    ok = frame[(frame.status == "ok") & ~cell.isin(cell[frame.status != "ok"])]
    if "pooch_predicted_s" in ok:
        ok = ok.assign(over_pooch=ok.predicted_s / ok.pooch_predicted_s)
        columns.append("over_pooch")
    grouped = ok.groupby(KEYS, sort=False)
    cells = grouped[columns].median()
    cells["budget_bytes"] = grouped.budget_bytes.first()
    cells["runs"] = grouped.size()
    cells["spread"] = grouped.measured_s.max() / grouped.measured_s.min() - 1
    cells = cells.reset_index()
    cells["time_error"] = (cells.predicted_s - cells.measured_s).abs() / cells.measured_s
    cells["peak_error"] = (cells.predicted_peak - cells.measured_peak).abs() / cells.measured_peak
    return cells


def report(frame, out: Path) -> None:
    """Errors against the targets, budget overruns, the measured ordering and the plot."""
    frame = _with_figures(frame)
    ok = cells_of(frame)
    _plot(ok, out / "fidelity.png")
    n_cells = len(frame.drop_duplicates(KEYS))
    print(f"{n_cells} cells ({len(frame)} runs): {len(ok)} planned and ran in every run, "
          f"{n_cells - len(ok)} refused or failed")
    print(f"measured time's run-to-run spread per cell (max / min - 1 over "
          f"{int(ok.runs.max()) if len(ok) else 0} runs): median {ok.spread.median():.1%}, "
          f"worst {ok.spread.max():.1%}")
    print(f"iteration time |pred - meas| / meas (medians over runs): median "
          f"{ok.time_error.median():.1%}, worst {ok.time_error.max():.1%} "
          f"(targets <= 10%, <= 20%); {int((ok.time_error > 0.2).sum())} cells over 20%")
    bias = (ok.predicted_s / ok.measured_s - 1).groupby(ok.policy, sort=False).median()
    print("signed time error pred / meas - 1, median per policy: "
          + ", ".join(f"{policy} {value:+.1%}" for policy, value in bias.items()))
    print(f"peak |pred - meas| / meas: median {ok.peak_error.median():.2%}, "
          f"worst {ok.peak_error.max():.2%} (target <= 5%)")
    runs = frame[frame.status == "ok"]
    over = runs[runs.measured_peak > runs.budget_bytes]
    print(f"measured peak above the budget: {len(over)} of {len(runs)} runs (target 0)")
    print("\nmeasured (predicted) ms per iteration at the same budget; - refused:\n")
    policies = [p for p in POLICIES if p in set(frame.policy)]
    print("| network | link | budget | " + " | ".join(policies) + " |")
    print("|---|---|---|" + "---|" * len(policies))
    agree = []
    for (net, link, fraction), group in ok.groupby(["network", "link", "fraction"], sort=False):
        by = group.set_index("policy")
        cells = [f"{by.measured_s[p] * 1e3:.0f} ({by.predicted_s[p] * 1e3:.0f})"
                 if p in by.index else "-" for p in policies]
        print(f"| {net} | {link} | {fraction:.1f} | " + " | ".join(cells) + " |")
        for other in ("swap-all", "superneurons"):
            if "pooch" not in by.index or other not in by.index:
                continue
            # the other policy's prediction over pooch's, on the same profiles where the runs
            # recorded pooch's (older CSVs: each policy's own runs' profiles)
            ratio = (by.over_pooch[other] if "over_pooch" in by
                     else by.predicted_s[other] / by.predicted_s["pooch"])
            if abs(ratio - 1) > 0.1:
                agree.append((f"{net}, {link}, {fraction:.1f}, {other}",
                              bool(by.measured_s["pooch"] < by.measured_s[other]), ratio > 1))
    same = "on the same profiles" if "over_pooch" in ok else "each on its own runs' profiles"
    faster = [name for name, measured, _ in agree if measured]
    print(f"\npooch measured faster than swap-all / superneurons where their predictions "
          f"({same}) differ by more than 10%: {len(faster)} of {len(agree)}")
    for name, measured, predicted in agree:
        if not measured:
            print(f"  not in {name}: pooch was predicted "
                  f"{'faster' if predicted else 'slower there too'}")
    if "over_pooch" in ok:
        slower = ok[(ok.policy != "pooch") & (ok.over_pooch < 1 - 1e-9)]
        print(f"cells where pooch's plan is predicted slower than another policy's on the same "
              f"profile: {len(slower)} of {int((ok.policy != 'pooch').sum())}")
    print(f"\n{out / 'fidelity.csv'}, {out / 'fidelity.png'}")


def _plot(ok, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (times, peaks) = plt.subplots(1, 2, figsize=(10, 4.5))
    for policy, group in ok.groupby("policy"):
        times.scatter(group.measured_s * 1e3, group.predicted_s * 1e3, label=policy, s=18)
        peaks.scatter(group.measured_peak / 2**20, group.predicted_peak / 2**20, label=policy,
                      s=18)
    for axis, unit in ((times, "ms"), (peaks, "MiB")):
        low, high = axis.get_xlim()
        axis.plot([low, high], [low, high], color="grey", linewidth=0.8)
        axis.set_xlabel(f"measured ({unit})")
        axis.set_ylabel(f"predicted ({unit})")
    times.set_title("forward + backward time")
    peaks.set_title("peak device memory")
    times.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
