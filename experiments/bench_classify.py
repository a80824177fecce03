"""Classification speed per model, and every policy's predicted iteration on analytic profiles.

For each model (analytic V100 profiles, cuDNN-charged convolutions as in the paper) and link,
runs every policy under the budget and prints: feasible, predicted iteration time, speed
relative to swap-all without scheduling (the paper's Figure 15 baseline), the keep / swap /
recompute counts (its Table 3) and the seconds the classification took; "pooch-paper" is
PoocH's two steps without our refinement. Target: ``pooch`` on
ResNeXt-101 3D, pcie3, 16 GiB in under 5 s on a 2-core machine (the paper: about 2 minutes).
Profiles are built first and not timed. Writes results/classify/policies.csv, a bar chart
of relative speeds and the ResNet-50 timelines of pooch and superneurons.

    python experiments/bench_classify.py [--budget 16GiB] [--links pcie3 nvlink2] [--repeat 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "results" / "classify"
# (model, batch, input size): ResNet-50 batch 512 as in the paper's Table 3; AlexNet at a
# batch that exceeds 16 GB; ResNeXt-101 3D at batch 1 with a video clip large enough to
# need about 24 GiB in core
MODELS = [("resnet50", 512, None), ("alexnet", 2048, None),
          ("resnext101-3d", 1, "3x128x448x448")]


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", default="16GiB")
    parser.add_argument("--links", nargs="+", default=["pcie3", "nvlink2"])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of pooch per case")
    parser.add_argument("--out", type=Path, default=OUT,
                        help="output folder (default %(default)s, the committed results)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    import pandas as pd
    from tqdm import tqdm

    from pooch_ext.analytic.tracing import analytic_profile
    from pooch_ext.policies import POLICY_NAMES, get_policy
    from pooch_ext.policies.search import SearchStats
    from pooch_ext.sim.budgets import minimum_budget
    from pooch_ext.report.timeline import plot_timeline
    from pooch_ext.units import format_bytes, parse_bytes

    budget = parse_bytes(args.budget)
    args.out.mkdir(parents=True, exist_ok=True)
    rows, speed_rows = [], []
    for model, batch, size in tqdm(MODELS, desc="profiles", leave=False):
        profile = analytic_profile(model, batch, size, conv="cudnn")
        print(f"\n{model} batch {batch} input {size or 'default'}: in-core "
              f"{format_bytes(profile.incore_peak_bytes)}, minimum "
              f"{format_bytes(minimum_budget(profile))}, feature maps {len(profile.feature_maps)}, "
              f"in-core iteration {profile.incore_time_s * 1e3:.1f} ms; budget "
              f"{format_bytes(budget)}")
        for link in args.links:
            seconds = []
            for _ in range(args.repeat):
                stats = SearchStats()
                started = time.perf_counter()
                get_policy("pooch").classify(profile, budget, link, stats=stats)
                seconds.append(time.perf_counter() - started)
            speed_rows.append(dict(model=model, link=link, pooch_seconds_min=min(seconds),
                                   pooch_seconds_median=statistics.median(seconds),
                                   l_out=stats.l_out, l_in=stats.l_in, tree_leaves=stats.leaves,
                                   simulations=stats.simulations,
                                   recompute_rounds=stats.recompute_rounds))
            base = None
            print(f"  {link:8s} {'policy':17s} {'fits':5s} {'iter ms':>9s} {'speed':>6s} "
                  f"{'keep':>5s} {'swap':>5s} {'rec':>5s} {'classify s':>10s}")
            for name in POLICY_NAMES:
                plan = get_policy(name).classify(profile, budget, link)
                if name == "swap-all-nosched":
                    base = plan.iteration_time_s
                rows.append(dict(model=model, batch=batch, input_size=size or "", link=link,
                                 budget_bytes=budget, policy=name, feasible=plan.feasible,
                                 iteration_time_s=plan.iteration_time_s,
                                 peak_bytes=plan.peak_bytes, **plan.counts,
                                 classify_seconds=plan.classify_seconds, reason=plan.reason))
                if model == "resnet50" and name in ("pooch", "superneurons"):
                    plot_timeline(plan.timeline, args.out / f"timeline_{model}_{link}_{name}.png",
                                  f"{model} b{batch}, {link}, {name}: "
                                  f"{plan.iteration_time_s * 1e3:.0f} ms")
            frame = pd.DataFrame([r for r in rows if r["model"] == model and r["link"] == link])
            for r in frame.itertuples():
                speed = base / r.iteration_time_s if r.feasible else float("nan")
                print(f"  {'':8s} {r.policy:17s} {'yes' if r.feasible else 'NO':5s} "
                      f"{r.iteration_time_s * 1e3:9.1f} {speed:6.2f} {r.keep:5d} {r.swap:5d} "
                      f"{r.recompute:5d} {r.classify_seconds:10.2f}")
            print(f"  pooch classification: {min(seconds):.2f} s best, "
                  f"{statistics.median(seconds):.2f} s median of {args.repeat}; "
                  f"|L_O| {stats.l_out}, |L_I| {stats.l_in}, {stats.leaves} tree leaves, "
                  f"{stats.simulations} simulations, {stats.recompute_rounds} recompute rounds")
    table = pd.DataFrame(rows)
    table.to_csv(args.out / "policies.csv", index=False)
    pd.DataFrame(speed_rows).to_csv(args.out / "pooch_seconds.csv", index=False)
    _plot_speeds(table, args.out / "relative_speed.png")
    print(f"\nwrote {args.out / 'policies.csv'}, {args.out / 'pooch_seconds.csv'}, "
          f"{args.out / 'relative_speed.png'}")
    return 0


def _plot_speeds(table, path: Path) -> None:
    """Speed relative to swap-all without scheduling, per model and link (paper Fig. 15/16)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    order = ["swap-all-nosched", "swap-all", "swap-opt", "pooch", "superneurons", "sqrt-n",
             "vdnn-conv", "vdnn-all"]
    cases = list(dict.fromkeys(zip(table.model, table.link)))
    fig, ax = plt.subplots(figsize=(12, 4.2))
    width = 0.8 / len(order)
    for k, name in enumerate(order):
        values = []
        for model, link in cases:
            sel = table[(table.model == model) & (table.link == link)].set_index("policy")
            base = sel.loc["swap-all-nosched", "iteration_time_s"]
            ok = bool(sel.loc[name, "feasible"])
            values.append(base / sel.loc[name, "iteration_time_s"] if ok else 0.0)
        ax.bar(np.arange(len(cases)) + (k - len(order) / 2 + 0.5) * width, values, width,
               label=name)
    ax.set_xticks(range(len(cases)), [f"{model}\n{link}" for model, link in cases])
    ax.set_ylabel("speed vs swap-all (w/o scheduling)")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.legend(ncol=4, fontsize=8)
    ax.set_title("Predicted speed per policy (0 = does not fit the budget)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
