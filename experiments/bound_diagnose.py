"""Where the MILP bound (pooch_ext/milp_bound.py) is loose for one plan: the program with the
plan's classes fixed, against the simulator running that plan.

The program's least time for fixed classes is at most the plan's simulated time; where
compute's arrival at a backward boundary in the simulator runs ahead of the program's
earliest arrival there, the program leaves out what holds the plan back at that boundary.
This prints those boundaries (where the difference grows by more than --step ms) with what
the simulator did just before (its waits, swap-ins and recomputes; a recompute's seconds
show as a step too, since the program counts recomputes in the iteration time, not at
their boundary), and the plan's swap-ins. It is how the bound's rows were found
(results/README "Distance to a proven bound").

    OPENBLAS_NUM_THREADS=1 .venv/bin/python experiments/bound_diagnose.py \\
        [--network resnet50] [--link pcie3] [--fraction 0.3] [--plan pooch|bound]

``--plan bound`` diagnoses the plan of the bound's own program (solving it first: up to
--time-limit seconds); ``pooch`` (default) pooch's plan.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

import common
from planner_scale import REAL


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--network", default="resnet50", choices=[r[0] for r in REAL])
    ap.add_argument("--link", default="pcie3", choices=list(common.PAPER_LINKS))
    ap.add_argument("--fraction", type=float, default=0.3,
                    help="budget as a fraction of the in-core need (default 0.3)")
    ap.add_argument("--plan", default="pooch", choices=["pooch", "bound"])
    ap.add_argument("--time-limit", type=common.positive, default=120.0)
    ap.add_argument("--step", type=common.positive, default=2.0,
                    help="print where the difference grows by more than this (ms)")
    args = ap.parse_args(argv)
    if not 0 < args.fraction <= 1:
        ap.error("--fraction must be in (0, 1]")

    from pooch_ext.milp_bound import fixed_class_arrivals, milp_bound
    from pooch_ext.policies import get_policy
    from pooch_ext.sim.budgets import minimum_budget
    from pooch_ext.sim.engine import run
    from pooch_ext.sim.model import SWAP, codes_of, compile_profile

    name, batch, shape = next(r for r in REAL if r[0] == args.network)
    profile = common.profile(name, batch, shape)
    model = compile_profile(profile, args.link)
    budget = int(profile.incore_peak_bytes * args.fraction)
    lowest = minimum_budget(profile)
    if budget < lowest:
        print(f"error: {args.fraction} of the in-core need is below the minimum budget "
              f"({lowest / profile.incore_peak_bytes:.3f} of it)", file=sys.stderr)
        return 2
    if args.plan == "pooch":
        codes = codes_of(model, get_policy("pooch").classify(profile, budget, args.link).classes)
    else:
        codes = milp_bound(model, budget, args.time_limit).codes
    least, program_arrival = fixed_class_arrivals(model, budget, codes, args.time_limit)
    simulated = run(model, codes, "early", budget, record=True)
    trace = simulated.trace
    arrival = np.asarray(trace["arrival"])[model.n_fwd:]
    start = np.asarray(trace["start"])
    print(f"{name} b{batch} {args.link} at {args.fraction} of in-core, {args.plan}'s plan "
          f"(keep / swap / recompute: {np.bincount(codes, minlength=3).tolist()}): simulated "
          f"{simulated.time_s * 1e3:.1f} ms, the program with its classes "
          f"{least * 1e3:.1f} ms")
    print(f"forward end: simulated {arrival[0] * 1e3:.1f} ms, program {program_arrival[0] * 1e3:.1f}")
    before = 0.0
    for k, b in enumerate(range(model.n_fwd, model.n + 1)):
        ahead = (arrival[k] - program_arrival[k]) * 1e3
        if k and abs(ahead - before) > args.step:
            done = [f"{what} {i}" for at, what, i in trace["actions"]
                    if at == b - 1 and what in ("wait", "swap_in", "recompute")]
            print(f"  boundary {b}: simulated {arrival[k] * 1e3:.1f} ms, program "
                  f"{program_arrival[k] * 1e3:.1f}, behind by {ahead:+.1f} ms "
                  f"({ahead - before:+.1f}; op {b - 1} began "
                  f"{(start[b - 1] - arrival[k - 1]) * 1e3:.1f} ms after compute reached it: "
                  f"{', '.join(done) or '-'})")
        before = ahead
    print("swap-ins (map, issued at boundary, start-end ms, GiB, first backward need):")
    for i, way, b, begin, end in trace["transfers"]:
        if way == "h2d" and codes[i] == SWAP:
            print(f"  {i}: {b}, {begin * 1e3:.1f}-{end * 1e3:.1f}, "
                  f"{model.nbytes[i] / 2**30:.2f}, {int(model.bwd_first[i])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
