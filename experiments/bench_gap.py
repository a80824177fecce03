"""Gap of the PoocH plan to the exact optimum, on small networks where the optimum is computable.

The optimum comes from pooch_ext.exact (branch and bound over all keep / swap / recompute
classifications, checked against brute force in the tests) against the same simulator, so the
gap measures the heuristic alone. Networks: seeded random CNN-like graphs (analytic/synthetic.py) on
pcie3 and nvlink2, and two small real ones (analytic profiles of small-resnet without its
stage-1 blocks, 13 feature maps, and AlexNet, 15);
budgets are fractions of the way from the minimum budget to the in-core peak. Printed per
network: the optimum, pooch (with our refinement) and pooch-paper (the paper's two steps
alone), their gaps, and the seconds each took. Target: pooch within 5% of the optimum.

    python experiments/bench_gap.py [--seeds 30] [--layers 9] [--fractions 0.25 0.6] [--no-real]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "results" / "gap"
# small real networks: (model, batch, conv charging, budget fractions); the exact search on
# these 13-15 feature maps takes seconds to a couple of minutes each. The demo's small-resnet
# has 21 maps, beyond the exact search, so its shallow variant (no stage-1 blocks) is used.
REAL = [("small-resnet-shallow", 4096, "im2col", (0.5,)), ("alexnet", 1024, "cudnn", (0.2, 0.5))]


def _real_profile(model: str, batch: int, conv: str):
    from pooch_ext.analytic.tracing import analytic_profile, profile_from_trace, trace_network
    from pooch_ext.models.small_resnet import SmallResNet

    if model != "small-resnet-shallow":
        return analytic_profile(model, batch, conv=conv)
    traced = trace_network(SmallResNet(stage1_blocks=0), 2, (3, 32, 32), model)
    return profile_from_trace(traced, batch, (3, 32, 32), conv=conv)


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=30, help="random networks per link")
    parser.add_argument("--layers", type=int, default=9, help="layers per random network")
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.6])
    parser.add_argument("--links", nargs="+", default=["pcie3", "nvlink2"])
    parser.add_argument("--no-real", action="store_true", help="skip the small real networks")
    parser.add_argument("--out", type=Path, default=OUT)
    return parser.parse_args(argv)


def _case(profile, link, frac, name):
    from pooch_ext.exact import exact_best
    from pooch_ext.policies import get_policy
    from pooch_ext.sim.model import compile_profile
    from pooch_ext.sim.budgets import budget_between

    budget = budget_between(profile, frac)
    best = exact_best(compile_profile(profile, link), budget)
    row = dict(network=name, link=link, fraction=frac, budget_bytes=budget,
               feature_maps=len(profile.feature_maps), optimum_s=best.time_s,
               exact_seconds=best.seconds, exact_simulations=best.simulations)
    for label, refine in (("pooch", True), ("pooch_paper", False)):
        started = time.perf_counter()
        plan = get_policy("pooch").classify(profile, budget, link, refine=refine)
        row[f"{label}_s"] = plan.iteration_time_s
        row[f"{label}_gap"] = plan.iteration_time_s / best.time_s - 1
        row[f"{label}_seconds"] = time.perf_counter() - started
    row["swap_all_gap"] = (get_policy("swap-all").classify(profile, budget, link)
                           .iteration_time_s / best.time_s - 1)
    return row


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    import pandas as pd
    from tqdm import tqdm

    from pooch_ext.analytic.synthetic import random_profile

    cases = [(f"random-{seed}", seed, link, frac) for seed in range(args.seeds)
             for link in args.links for frac in args.fractions]
    rows = []
    for name, seed, link, frac in tqdm(cases, desc="random networks", leave=False):
        rows.append(_case(random_profile(seed, args.layers, link=link), link, frac, name))
    if not args.no_real:
        for model, batch, conv, fractions in tqdm(REAL, desc="real networks", leave=False):
            profile = _real_profile(model, batch, conv)
            for link in args.links:
                for frac in fractions:
                    rows.append(_case(profile, link, frac, f"{model}-b{batch}-{conv}"))
    table = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "gap.csv", index=False)

    print(f"{'network':28s} {'link':8s} {'frac':>4s} {'maps':>4s} {'optimum ms':>10s} "
          f"{'pooch gap':>9s} {'paper gap':>9s} {'swap-all':>9s} {'pooch s':>7s} {'exact s':>7s}")
    for r in table.itertuples():
        print(f"{r.network:28s} {r.link:8s} {r.fraction:4.2f} {r.feature_maps:4d} "
              f"{r.optimum_s * 1e3:10.3f} {100 * r.pooch_gap:8.2f}% {100 * r.pooch_paper_gap:8.2f}% "
              f"{100 * r.swap_all_gap:8.1f}% {r.pooch_seconds:7.2f} {r.exact_seconds:7.1f}")
    for label, sel in (("random", table.network.str.startswith("random")),
                       ("real", ~table.network.str.startswith("random")), ("all", table.index >= 0)):
        part = table[sel]
        if len(part):
            print(f"{label:7s} networks {len(part):3d}: pooch gap mean {100 * part.pooch_gap.mean():.2f}% "
                  f"max {100 * part.pooch_gap.max():.2f}% (within 5%: "
                  f"{(part.pooch_gap <= 0.05).sum()}/{len(part)}); paper steps alone mean "
                  f"{100 * part.pooch_paper_gap.mean():.2f}% max {100 * part.pooch_paper_gap.max():.2f}%")
    print(f"wrote {args.out / 'gap.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
