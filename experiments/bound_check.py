"""The MILP bound (pooch_ext/milp_bound.py) against the exact optimum (pooch_ext/exact.py)
on small random networks: the bound must never be above the optimum (every constraint holds
for every plan the simulator runs); how far below it sits says how much the bound proves.

Writes results/gap/bound_check.csv (one row per case) and prints the summary.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python experiments/bound_check.py [--seeds 12]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
from tqdm import tqdm

import pooch_ext  # noqa: F401  (chainer import compat)
from pooch_ext.analytic.synthetic import random_profile
from pooch_ext.exact import exact_best
from pooch_ext.milp_bound import milp_bound
from pooch_ext.sim.budgets import budget_between
from pooch_ext.sim.model import compile_profile

OUT = Path(__file__).resolve().parent.parent / "results" / "gap" / "bound_check.csv"
LAYERS, LINKS, FRACTIONS = (7, 10), ("pcie3", "nvlink2", "cpu"), (0.0, 0.1, 0.25, 0.45, 0.7)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=12, help="random networks per size (>= 1)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    if args.seeds < 1:
        ap.error("--seeds must be at least 1")
    cases = [(s, n, link) for s in range(args.seeds) for n in LAYERS for link in LINKS]
    rows = []
    for seed, layers, link in tqdm(cases, desc="bound check", leave=False):
        profile = random_profile(seed, n_layers=layers)
        model = compile_profile(profile, link)
        for fraction in FRACTIONS:
            budget = budget_between(profile, fraction)
            best = exact_best(model, budget).time_s
            bound = milp_bound(model, budget, time_limit_s=30)
            rows.append({"seed": seed, "layers": layers, "link": link, "fraction": fraction,
                         "maps": model.m, "optimum_s": best, "bound_s": bound.bound_s,
                         "bound_optimal": bound.optimal, "bound_over_optimum": bound.bound_s / best})
    table = pd.DataFrame(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False)
    ratio = table.bound_over_optimum
    above = int((ratio > 1 + 1e-7).sum())
    print(f"{len(table)} cases: bound above the optimum in {above}; below it by "
          f"{(1 - ratio).mean():.1%} on average, {(1 - ratio).median():.1%} median, "
          f"{(1 - ratio).max():.1%} at worst; solved to optimality in "
          f"{int(table.bound_optimal.sum())}")
    return 1 if above else 0


if __name__ == "__main__":
    sys.exit(main())
