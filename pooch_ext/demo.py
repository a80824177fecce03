"""``make demo``: train small-resnet under PoocH with a memory budget below its in-core need.

    python -m pooch_ext.demo [--iters 40] [--batch 32] [--budget-fraction 0.4] [--cpu]
    mpiexec -n 2 python -m pooch_ext.demo --mpi [...]   (data parallel: pooch_ext/demo_mpi.py)

1. measure the network's in-core need (a short profiling run);
2. train it for ``--iters`` iterations twice from the same seed, plainly and under
   ``PoocH(budget=...)``, alternating iteration by iteration so both see the same machine
   load: on the GPU when CuPy sees one, else on the CPU device, whose accounted
   memory the budget bounds;
3. write results/demo/: the measured profile, plan.csv, iterations.csv, allocations.csv
   (the device's malloc/free events while profiling), losses.csv, loss.png (both loss curves),
   timeline.png (the plan's simulated timeline), summary.json.

The budget is ``--budget-fraction`` of the in-core need; when that is below the smallest
budget any plan can reach, it is raised to 5% of the way from that smallest budget to the
in-core need (the demo says so, with both figures). The data are a
learnable synthetic task (labels from a fixed random linear teacher, a few epochs over eight
batches), so the loss falls.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from pooch_ext.errors import BudgetTooSmallError

# where --budget-fraction is below any plan's minimum: this far from it to the in-core need
FALLBACK_WAY = 0.05
# on a GPU a budget does not hold yet (results/gpu/README.md, H200: plans held up to 15% more,
# CuPy's pool took 1.5x): the pool may take this times the budget, so the demo runs and
# shows what the plan held against the budget instead of stopping at an out-of-memory error
GPU_POOL_HEADROOM = "3"

OUT = Path("results") / "demo"


def teacher_batches(n: int, batch: int, shape: tuple[int, ...], n_classes: int, xp: Any = np,
                    seed: int = 7, distinct: int = 8) -> list[tuple[Any, Any]]:
    """``n`` batches cycling over ``distinct`` fixed ones (a small data set, several epochs):
    inputs with labels a fixed random linear map of their 4x4-pooled pixels decides."""
    rng = np.random.RandomState(seed)
    c, h, w = shape
    teacher = rng.randn(n_classes, c * 4 * 4).astype(np.float32)
    out = []
    for _ in range(min(n, distinct)):
        x = rng.randn(batch, c, h, w).astype(np.float32)
        pooled = x.reshape(batch, c, 4, h // 4, 4, w // 4).mean(axis=(3, 5)).reshape(batch, -1)
        t = (pooled @ teacher.T).argmax(axis=1).astype(np.int32)
        out.append((xp.asarray(x), xp.asarray(t)))
    return [out[i % len(out)] for i in range(n)]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    from pooch_ext.commands._paths import output_folder
    from pooch_ext.links import PRESETS
    from pooch_ext.models import MODEL_NAMES
    from pooch_ext.policies import POLICY_NAMES

    parser = argparse.ArgumentParser(prog="python -m pooch_ext.demo",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--mpi", action="store_true",
                        help="the data-parallel example instead (under mpiexec; its options: "
                             "python -m pooch_ext.demo_mpi --help)")
    parser.add_argument("--model", default="small-resnet", choices=MODEL_NAMES,
                        help="the network (default small-resnet)")
    parser.add_argument("--batch", type=int, default=32, help="batch size (default 32)")
    parser.add_argument("--iters", type=int, default=40,
                        help="training iterations, plain and under PoocH (default 40)")
    parser.add_argument("--profile-iters", type=int, default=3,
                        help="iterations PoocH profiles before it plans (default 3)")
    parser.add_argument("--budget-fraction", type=float, default=0.4,
                        help="budget as a fraction of the in-core need, in (0, 1] "
                             "(default 0.4)")
    parser.add_argument("--policy", default="pooch", choices=POLICY_NAMES,
                        help="the policy PoocH plans with (default pooch)")
    parser.add_argument("--link", default="pcie3", choices=tuple(PRESETS),
                        help="link of the CPU device's copy engines (CPU only)")
    parser.add_argument("--cpu", action="store_true", help="use the CPU device even "
                                                           "where a GPU is present")
    parser.add_argument("--out", type=output_folder, default=OUT,
                        help="folder for the results (default results/demo); created, with any "
                             "missing parent folders, if it does not exist")
    args = parser.parse_args(argv)
    if args.batch < 1:
        parser.error(f"--batch must be at least 1, got {args.batch}")
    if not 0 < args.budget_fraction <= 1:     # nan too
        parser.error(f"--budget-fraction must lie in (0, 1], got {args.budget_fraction}")
    if args.profile_iters < 1 or args.iters < args.profile_iters + 2:
        # the first planned iteration also classifies: speeds are medians of the ones after it
        parser.error(f"--iters must be at least --profile-iters + 2 (and --profile-iters at "
                     f"least 1), got --iters {args.iters} --profile-iters {args.profile_iters}")
    return args


def _plot_losses(path: Path, plain: list[float], pooch: list[float], profile_iters: int,
                 title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    steps = np.arange(1, len(plain) + 1)
    ax.plot(steps, plain, lw=3, color="#bbbbbb", label="plain Chainer (in-core)")
    ax.plot(steps[:len(pooch)], pooch, lw=1.2, color="#d62728", label="PoocH under the budget")
    ax.axvspan(0.5, profile_iters + 0.5, color="#1f77b4", alpha=0.08, label="profiling")
    ax.set_xlabel("iteration")
    ax.set_ylabel("training loss")
    ax.set_title(title, fontsize=9)
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_timeline(path: Path, pooch: Any) -> str:
    """The simulator's own timeline figure of the executed plan."""
    from pooch_ext.report.timeline import plot_timeline

    plot_timeline(pooch.timeline, path, title=pooch.decision().split(";")[0])
    return str(path)


def main(argv: list[str] | None = None) -> int:
    """Run the demo (see the module docstring); 0 when PoocH trained bit-identically.
    ``--mpi``: the data-parallel example instead (pooch_ext/demo_mpi.py, under mpiexec)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--mpi" in argv:
        from pooch_ext import demo_mpi

        return demo_mpi.main([a for a in argv if a != "--mpi"])
    args = _parse(argv)
    from pooch_ext.measure import cuda_available

    gpu = cuda_available() and not args.cpu
    with _gpu_pool_headroom(gpu):
        return _demo(args, gpu)


@contextlib.contextmanager
def _gpu_pool_headroom(gpu: bool) -> Any:
    """``GPU_POOL_HEADROOM`` for the CuPy device's pool, unless the user set one."""
    if not gpu or "POOCH_GPU_POOL_HEADROOM" in os.environ:
        yield
        return
    print(f"note: on a GPU a budget does not hold yet (results/gpu/README.md): CuPy's pool may "
          f"take up to {GPU_POOL_HEADROOM}x the budget here; the peak printed is what the "
          f"iteration held", file=sys.stderr)
    os.environ["POOCH_GPU_POOL_HEADROOM"] = GPU_POOL_HEADROOM
    try:
        yield
    finally:
        del os.environ["POOCH_GPU_POOL_HEADROOM"]


def _demo(args: argparse.Namespace, gpu: bool) -> int:
    """Steps 1-3 of the module docstring, on the GPU or the CPU device."""
    from tqdm import tqdm

    from pooch_ext.testing import side_by_side_figures, train_side_by_side
    from pooch_ext.models import default_input_size, default_n_classes
    from pooch_ext.measure import setup_model

    xp, sync = np, None
    if gpu:
        import cupy
        xp, sync = cupy, cupy.cuda.get_current_stream().synchronize
    where = "GPU" if gpu else f"CPU device ({args.link} link)"
    shape, classes = default_input_size(args.model), default_n_classes(args.model)
    args.out.mkdir(parents=True, exist_ok=True)
    need = _choose_budget(args, gpu, where)

    # plain Chainer and PoocH from the same seed on the same data, iteration by iteration
    batches = teacher_batches(args.iters, args.batch, shape, classes, xp)
    plain_pair, pooch_pair = setup_model(args.model, gpu), setup_model(args.model, gpu)
    pooch_kwargs = {"profile_iters": args.profile_iters, "budget": need["budget_bytes"],
                    "policy": args.policy, "link": "auto" if gpu else args.link}
    with tqdm(total=args.iters, desc="plain Chainer + PoocH", unit="it", file=sys.stderr) as bar:
        plain, pooch_run = train_side_by_side(plain_pair, pooch_pair, batches, pooch_kwargs,
                                              progress=bar, sync=sync)
    if isinstance(pooch_run.error, BudgetTooSmallError):
        # the floor above is any plan's: the chosen policy's own plan may need more
        print(f"pooch-ext demo: {pooch_run.error}; try --budget-fraction "
              f"{min(1.0, pooch_run.error.minimum_bytes / need['incore_need_bytes'] + 0.01):.2f} "
              f"or --policy pooch", file=sys.stderr)
        return 2
    if pooch_run.error is not None:
        raise pooch_run.error
    figures = side_by_side_figures(plain, pooch_run, plain_pair, pooch_pair,
                                   args.profile_iters)
    summary = _write_results(args, gpu, where, need, plain, pooch_run, figures)
    _print_summary(args.out, summary, pooch_run.pooch.plan)
    return 0 if figures["identical"] else 1


def _choose_budget(args: argparse.Namespace, gpu: bool, where: str) -> dict:
    """Measure the in-core need, then the budget: ``--budget-fraction`` of it, or, where that
    is below the smallest budget any plan reaches, ``FALLBACK_WAY`` of the way from there to
    the in-core need (with a note)."""
    from pooch_ext.measure import measured_profile
    from pooch_ext.sim.budgets import budget_between, minimum_budget
    from pooch_ext.units import format_bytes

    probe = measured_profile(args.model, args.batch, iters=2, link=args.link, gpu=gpu)
    incore, floor = probe.incore_peak_bytes, minimum_budget(probe)
    budget = int(args.budget_fraction * incore)
    note = ""
    if budget < floor:
        budget = budget_between(probe, FALLBACK_WAY)
        note = (f"{args.budget_fraction:.0%} of the in-core need is below the smallest budget "
                f"any plan reaches ({format_bytes(floor)}, {floor / incore:.0%}); using "
                f"{format_bytes(budget)}, {FALLBACK_WAY:.0%} of the way from there to the "
                f"in-core need")
    print(f"{args.model}, batch {args.batch}, on the {where}: in-core needs "
          f"{format_bytes(incore)}; budget {format_bytes(budget)} ({budget / incore:.0%})"
          + (f"\n  note: {note}" if note else ""), file=sys.stderr)
    return {"incore_need_bytes": int(incore), "minimum_budget_bytes": int(floor),
            "budget_bytes": int(budget), "budget_fraction": budget / incore,
            "budget_note": note}


def _write_results(args: argparse.Namespace, gpu: bool, where: str, need: dict, plain: Any,
                   pooch_run: Any, figures: dict) -> dict:
    """results/demo/: profile, plan, iterations, allocations, losses, the two figures and
    summary.json; returns the summary."""
    import pandas as pd

    pooch = pooch_run.pooch
    pooch.profile.save(args.out / "profile")
    pooch.plan.to_csv(args.out / "plan.csv")
    pooch.iterations.to_csv(args.out / "iterations.csv", index=False)
    pooch.allocations.to_csv(args.out / "allocations.csv", index=False)
    pd.DataFrame({"iteration": range(len(plain.losses)), "plain": plain.losses,
                  "pooch": pooch_run.losses, "plain_s": plain.seconds,
                  "pooch_s": pooch_run.seconds}).to_csv(args.out / "losses.csv", index=False)
    _plot_losses(args.out / "loss.png", plain.losses, pooch_run.losses, args.profile_iters,
                 f"{args.model}, batch {args.batch}: PoocH at {need['budget_fraction']:.0%} of "
                 f"the in-core memory ({'GPU' if gpu else 'CPU device'})")
    timeline = _plot_timeline(args.out / "timeline.png", pooch)
    plain_s, pooch_s = figures["plain_s"], figures["pooch_s"]
    summary = {
        "model": args.model, "batch": args.batch, "iterations": args.iters, "device": where,
        **need,
        "policy": pooch.plan.policy, "counts": pooch.plan.counts,
        "predicted_iteration_s": pooch.plan.iteration_time_s,
        "predicted_peak_bytes": int(pooch.plan.peak_bytes),
        "measured_peak_bytes": figures["peak"],
        "plain_iteration_s": plain_s, "pooch_iteration_s": pooch_s,
        "slowdown": pooch_s / plain_s, "bit_identical": figures["identical"],
        "decision": pooch.decision(), "timeline_png": timeline,
    }
    arena = getattr(pooch.device, "arena", None)    # the CuPy device's opt-in arena (GPU only)
    if arena is not None:
        summary["arena"] = {"served": arena.served, "fallbacks": arena.fallbacks}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _print_summary(out: Path, summary: dict, plan: Any) -> None:
    from pooch_ext.units import format_bytes

    counts = plan.counts
    plain_s, pooch_s = summary["plain_iteration_s"], summary["pooch_iteration_s"]
    print(f"\nplan ({plan.policy}): keep {counts['keep']}, swap {counts['swap']}, "
          f"recompute {counts['recompute']}\n"
          f"peak device memory: {format_bytes(summary['measured_peak_bytes'])} accounted "
          f"(predicted {format_bytes(summary['predicted_peak_bytes'])}, budget "
          f"{format_bytes(summary['budget_bytes'])})"
          + (" OVER the budget: on a GPU a budget does not hold yet\n"
             if summary['measured_peak_bytes'] > summary['budget_bytes'] else "\n")
          + f"iteration: plain {plain_s * 1e3:.1f} ms, PoocH {pooch_s * 1e3:.1f} ms "
          f"({pooch_s / plain_s:.2f}x; predicted {plan.iteration_time_s * 1e3:.1f} ms)\n"
          f"losses and parameters bit-identical to plain Chainer: {summary['bit_identical']}\n"
          + (f"arena: {summary['arena']['served']} requests served, "
             f"{summary['arena']['fallbacks']} left to CuPy's pool\n" if "arena" in summary else "")
          + f"written to {out}/ (profile/, plan.csv, iterations.csv, allocations.csv, "
          f"losses.csv, loss.png, timeline.png, summary.json)")


if __name__ == "__main__":
    sys.exit(main())
