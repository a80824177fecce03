"""``make demo-mpi``: data-parallel training (ChainerMN) under PoocH on every rank.

    mpiexec -n 2 python -m pooch_ext.demo_mpi [--model small-resnet] [--batch 16]
        [--iters 10] [--budget-fraction 0.03] [--no-host-budget]
    (or: mpiexec -n 2 python -m pooch_ext.demo --mpi ...)

Each rank trains its own shard of a synthetic task twice from the same seed, plainly with
ChainerMN (``create_multi_node_optimizer`` over the ``naive`` communicator: MPI, CPU) and
under ``PoocH(comm=comm)`` within a budget, alternating iteration by iteration. The ranks
profile, rank 0 combines their profiles and plans for all (pooch_ext/distributed.py), so every
rank runs the same schedule. The device budget is ``--budget-fraction`` of the way from the
smallest budget any plan reaches to the in-core need, measured first by a short profiling run
(default 3%: at exactly the smallest, the run's own measurements may come out a little above
the probe's); the host budget is the least host memory a plan within it needs (``budgets``),
so the plan must both swap and recompute (small-resnet: keep 14 / swap 6 / recompute 1).
Rank 0 shows the progress bar and prints one summary; it says ``identical`` only when every
rank's losses and parameters equal plain ChainerMN's bit for bit, and every rank exits
non-zero otherwise.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mpiexec -n 2 python -m pooch_ext.demo_mpi",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small-resnet")
    parser.add_argument("--batch", type=int, default=16, help="samples per rank")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--profile-iters", type=int, default=3)
    parser.add_argument("--budget-fraction", type=float, default=0.03,
                        help="of the way from the smallest budget to the in-core need")
    parser.add_argument("--no-host-budget", dest="host_budget", action="store_false",
                        help="no host-memory budget (default: the least a plan needs, so "
                             "that swapping everything does not fit and maps are recomputed)")
    parser.add_argument("--policy", default="pooch")
    parser.add_argument("--link", default="cpu", help="the CPU device's copy-engine link")
    parser.add_argument("--json", type=Path, default=None,
                        help="also write rank 0's summary to this file (for tests)")
    args = parser.parse_args(argv)
    if args.iters < args.profile_iters + 2:
        parser.error(f"--iters ({args.iters}) must be at least --profile-iters + 2 "
                     f"({args.profile_iters + 2}): planned iterations to time after the first")
    if not 0 <= args.budget_fraction <= 1:
        parser.error(f"--budget-fraction must be within 0..1, got {args.budget_fraction}")
    return args


def communicator() -> Any:
    """ChainerMN's ``naive`` communicator (MPI on the CPU), or SystemExit saying how to get
    MPI when mpi4py is missing."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        raise SystemExit("data-parallel training needs MPI: pip install '.[mpi]' (mpi4py and "
                         "mpich), or make demo-mpi, which installs them") from None
    import chainermn

    return chainermn.create_communicator("naive")


def main(argv: list[str] | None = None) -> int:
    """Run the example (see the module docstring); 0 when every rank trained identically."""
    args = _parse(argv)
    import chainermn
    from tqdm import tqdm

    from pooch_ext.hooks.cpu_device import CpuDevice
    from pooch_ext.measure import setup_model
    from pooch_ext.models import default_input_size, default_n_classes
    from pooch_ext.testing import side_by_side_figures, synthetic_batches, train_side_by_side

    comm = communicator()
    shape, classes = default_input_size(args.model), default_n_classes(args.model)
    # each rank its own shard of the data
    batches = synthetic_batches(args.iters, args.batch, shape, classes, seed=1 + comm.rank)

    def pair() -> tuple:
        model, optimizer = setup_model(args.model, gpu=False)
        return model, chainermn.create_multi_node_optimizer(optimizer, comm)

    # the in-core need and the smallest budget: a short profiling run on every rank
    probe_pair = pair()
    _, probe = train_side_by_side(pair(), probe_pair, batches[:args.profile_iters],
                                  dict(profile_iters=args.profile_iters, policy=None,
                                       device=CpuDevice(link=args.link), verbose=False, comm=comm))
    if probe.error is not None:
        raise probe.error
    budget, host_budget = comm.bcast_obj(
        budgets(probe.pooch.profile, args.budget_fraction, args.host_budget)
        if comm.rank == 0 else None)

    plain_pair, pooch_pair = pair(), pair()
    kwargs = dict(profile_iters=args.profile_iters, budget=budget, policy=args.policy,
                  device=CpuDevice(link=args.link), comm=comm, host_budget=host_budget)
    with tqdm(total=args.iters, desc=f"rank 0 of {comm.size}: plain ChainerMN + PoocH",
              unit="it", file=sys.stderr, disable=comm.rank != 0) as bar:
        plain, run = train_side_by_side(plain_pair, pooch_pair, batches, kwargs, progress=bar)
    if run.error is not None:
        raise run.error
    pooch = run.pooch
    mine = dict(side_by_side_figures(plain, run, plain_pair, pooch_pair, args.profile_iters),
                classes=pooch.plan.classes)
    ranks = comm.gather_obj(mine)
    ok = comm.bcast_obj(all(r["identical"] for r in ranks) if comm.rank == 0 else None)
    if comm.rank == 0:
        summary = _summary(comm.size, budget, host_budget, pooch, ranks)
        _print_summary(args, summary)
        if args.json is not None:
            args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if ok else 1


def budgets(profile: Any, fraction: float, host: bool) -> tuple[int, int | None]:
    """(device budget, host budget): ``fraction`` of the way from the smallest device budget
    to the in-core need; with ``host``, the least host memory a plan within that device
    budget needs. At the smallest device budget every map alive at the peak must be swapped
    or recomputed; at the least host memory, too many swapped bytes do not fit either, so the
    plan must recompute some: the pair forces both."""
    from pooch_ext.sim.budgets import budget_between, minimum_host_budget

    device = budget_between(profile, fraction)
    return device, (minimum_host_budget(profile, device) or None) if host else None


def _summary(size: int, budget: int, host_budget: int | None, pooch: Any,
             ranks: list[dict]) -> dict:
    plan = pooch.plan
    allreduce = pooch.profile.meta.get("after_backward") or {}
    return dict(ranks=size, budget_bytes=int(budget), policy=plan.policy, counts=plan.counts,
                host_budget_bytes=host_budget, host_peak_bytes=int(plan.host_peak_bytes),
                allreduce_s=allreduce.get("seconds"),
                allreduce_scratch_bytes=allreduce.get("scratch_bytes"),
                predicted_iteration_s=plan.iteration_time_s,
                same_plan=all(r["classes"] == ranks[0]["classes"] for r in ranks),
                identical=all(r["identical"] for r in ranks),
                different_ranks=[k for k, r in enumerate(ranks) if not r["identical"]],
                measured_peak_bytes=[r["peak"] for r in ranks],
                predicted_peak_bytes=int(plan.peak_bytes),
                plain_iteration_s=max(r["plain_s"] for r in ranks),
                pooch_iteration_s=max(r["pooch_s"] for r in ranks))


def _print_summary(args: argparse.Namespace, summary: dict) -> None:
    from pooch_ext.units import format_bytes

    counts = summary["counts"]
    print(f"\n{args.model}, batch {args.batch} per rank, {summary['ranks']} ranks (ChainerMN, "
          f"naive communicator, CPU device): budget {format_bytes(summary['budget_bytes'])} "
          f"per rank"
          + (f", host budget {format_bytes(summary['host_budget_bytes'])} (the least a plan "
             f"needs: swapping more does not fit)" if summary["host_budget_bytes"] else "")
          + "\n"
          f"plan ({summary['policy']}, "
          f"{'the same on every rank' if summary['same_plan'] else 'DIFFERS between ranks'}): "
          f"keep {counts['keep']}, swap {counts['swap']}, recompute {counts['recompute']}\n"
          f"peak device memory per rank: "
          + ", ".join(format_bytes(p) for p in summary["measured_peak_bytes"])
          + f" (predicted {format_bytes(summary['predicted_peak_bytes'])})\n"
          f"iteration (slowest rank): plain {summary['plain_iteration_s'] * 1e3:.1f} ms, "
          f"PoocH {summary['pooch_iteration_s'] * 1e3:.1f} ms (predicted "
          f"{summary['predicted_iteration_s'] * 1e3:.1f} ms, "
          + (f"including the gradient all-reduce, measured while profiling: "
             f"{summary['allreduce_s'] * 1e3:.1f} ms, "
             f"{format_bytes(summary['allreduce_scratch_bytes'])} of temporary memory)\n"
             if summary["allreduce_s"] is not None else
             "no all-reduce measured before the plan: --profile-iters below 3)\n")
          + ("losses and parameters on every rank: identical to plain ChainerMN, bit for bit"
             if summary["identical"] else
             "losses or parameters DIFFER from plain ChainerMN on ranks "
             + ", ".join(map(str, summary["different_ranks"]))))


if __name__ == "__main__":
    sys.exit(main())
