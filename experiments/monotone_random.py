"""Is pooch, called once per point, monotone on random networks? Link and budget grids.

planner_scale.py ``monotone`` checks the paper's networks; this checks many small random
CNN-like graphs (pooch_ext.analytic.synthetic.random_profile), each classified by a single
call of pooch per grid point, with no sweep (policies/sweep.py is monotone by construction):

* link grids: every network at 0.1 and 0.3 of the way from its minimum budget to its
  in-core need, links of 0.5-8 GB/s each way (slow links, where swaps and recomputes
  compete hardest);
* budget grids: every network on pcie3, budgets at 12 points from 0.02 to 0.6 of the way.

A violation is a step to a faster link or a larger budget whose plan is slower by more than
0.1%. Writes ``monotone_random.csv`` (one row per grid point: ``kind`` link / budget,
``layers``, ``seed``, ``fixed`` what the grid holds fixed (the budget as a fraction of the
way, or the link), ``x`` the point (GB/s, or the budget fraction), ``pooch_s`` the plan's
predicted iteration seconds) and prints, per kind of grid, how many grids, how many
violations and the largest (a fraction: 0.023 is 2.3% slower), then the worst steps.

    OPENBLAS_NUM_THREADS=1 python experiments/monotone_random.py [--layers 12 16 24] [--seeds 30]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

import common
from pooch_ext.analytic.synthetic import random_profile
from pooch_ext.links import Link
from pooch_ext.policies import get_policy
from pooch_ext.sim.budgets import budget_between

OUT = common.RESULTS / "scale"
GBPS = (0.5, 1, 1.5, 2, 3, 4, 6, 8)
LINK_FRACTIONS = (0.1, 0.3)
BUDGET_FRACTIONS = tuple(np.round(np.linspace(0.02, 0.6, 12), 4))
ABOVE = 1e-3


def grids(layers: list[int], seeds: int) -> pd.DataFrame:
    """One row per grid point: kind (link / budget), layers, seed, the grid's fixed value
    (budget fraction or link), the point x (GB/s or budget fraction) and pooch's time."""
    pooch = get_policy("pooch")
    rows = []
    jobs = [(n, seed) for n in layers for seed in range(seeds)]
    for n, seed in tqdm(jobs, desc="random grids", unit="net", leave=False):
        profile = random_profile(seed, n_layers=n)
        for fraction in LINK_FRACTIONS:
            budget = budget_between(profile, fraction)
            for g in GBPS:
                plan = pooch.classify(profile, budget, Link(f"{g:g}GB/s", g * 1e9, g * 1e9))
                rows.append({"kind": "link", "layers": n, "seed": seed, "fixed": fraction,
                             "x": g, "pooch_s": plan.iteration_time_s})
        for fraction in BUDGET_FRACTIONS:
            plan = pooch.classify(profile, budget_between(profile, fraction), "pcie3")
            rows.append({"kind": "budget", "layers": n, "seed": seed, "fixed": "pcie3",
                         "x": fraction, "pooch_s": plan.iteration_time_s})
    return pd.DataFrame(rows)


def violations(table: pd.DataFrame, above: float = ABOVE) -> pd.DataFrame:
    """Each step along a grid (x ascending) whose plan is slower by more than ``above``."""
    found = []
    for key, grid in table.groupby(["kind", "layers", "seed", "fixed"], sort=False):
        times = grid.sort_values("x")
        for a, b in zip(times.itertuples(), list(times.itertuples())[1:]):
            if b.pooch_s > a.pooch_s * (1 + above):
                found.append({"kind": key[0], "layers": key[1], "seed": key[2],
                              "fixed": key[3], "from": a.x, "to": b.x,
                              "slower": b.pooch_s / a.pooch_s - 1})
    return pd.DataFrame(found, columns=["kind", "layers", "seed", "fixed", "from", "to",
                                        "slower"])


def summary(table: pd.DataFrame, found: pd.DataFrame) -> pd.DataFrame:
    """Per kind of grid: grids, violations above 0.1%, the largest (0 where none)."""
    rows = []
    for kind, sel in table.groupby("kind", sort=False):
        bad = found[found.kind == kind]
        rows.append({"kind": kind, "grids": sel.groupby(["layers", "seed", "fixed"]).ngroups,
                     "violations": len(bad),
                     "largest": float(bad.slower.max()) if len(bad) else 0.0})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=OUT,
                    help=f"output folder (default {OUT}, the committed results)")
    ap.add_argument("--layers", type=int, nargs="+", default=[12, 16, 24],
                    help="layers of the random networks, one set of seeds per size")
    ap.add_argument("--seeds", type=int, default=30, help="random networks per size")
    args = ap.parse_args(argv)
    if args.seeds < 1 or min(args.layers) < 2:
        ap.error("--seeds must be >= 1 and --layers >= 2")
    table = grids(args.layers, args.seeds)
    path = common.write_csv(table, args.out_dir / "monotone_random.csv")
    found = violations(table)
    print(summary(table, found).to_string(index=False))
    if len(found):
        print(found.sort_values("slower", ascending=False).head(10).to_string(index=False))
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
