"""Each optimization (the paper's Figures 15 and 16): speed-up over swap-all without scheduling.

For each network and link, the four methods of sec. 5.1 under the 16 GB V100 budget:
swap-all (w/o scheduling), swap-all (swap-ins moved up, sec. 4.3), swap-opt (keep / swap step
only) and PoocH; "pooch-paper" is PoocH's two steps as the paper describes them, "pooch"
adds our local refinement. The paper does not give its batch sizes ("configured so that problem
sizes exceed the GPU memory capacity"); ours: ResNet-50 batch 512 (in-core 42.5 GB, 2.5x the
capacity; the batch of Table 3) and AlexNet batch 2432, the largest multiple of 64 any plan can
fit (in-core 21.2 GB, 1.25x): AlexNet's LocalResponseNormalization backward alone holds about
5.8 conv1-sized arrays, so past ~2500 images nothing fits 16 GB, whatever is swapped; and
VGG-16 batch 256, the third network the paper names (in-core 17.8 GiB, 1.13x; vDNN's batch).

Writes <out>/fig15_16.csv (one row per network, link and method, with ``speedup``) and
<out>/fig15_16.png (one panel per machine, as the paper's two figures).

    .venv/bin/python experiments/fig15_16_each_optimization.py [--cases resnet50:512 alexnet:2432 vgg16:256]
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

import common
import matplotlib.pyplot as plt

OUT = common.RESULTS / "fig15_16"
CASES = ("resnet50:512", "alexnet:2432", "vgg16:256")
METHODS = ("swap-all-nosched", "swap-all", "swap-opt", "pooch-paper", "pooch")
LABELS = {"swap-all-nosched": "swap-all (w/o sched.)", "swap-all": "swap-all",
          "swap-opt": "swap-opt", "pooch-paper": "PoocH (paper's steps)",
          "pooch": "PoocH (+ refinement)"}


def measure(cases: list[tuple[str, int]], links: list[str],
            budget: str | int | None = None) -> pd.DataFrame:
    """Every method on every (network, link), with its speed-up over swap-all w/o scheduling
    and the in-core ceiling on the same scale."""
    rows = []
    jobs = [(m, b, link) for m, b in cases for link in links]
    for model, batch, link in tqdm(jobs, desc="fig15/16", unit="case", leave=False):
        p = common.profile(model, batch)
        for method in METHODS:
            rows.append(common.run(p, method, link, budget)[1])
    table = pd.DataFrame(rows)
    nosched = table[table.policy == "swap-all-nosched"]
    base = nosched.set_index(["model", "link"])["iteration_time_s"]
    keys = list(zip(table.model, table.link))
    table["speedup"] = np.where(table.feasible, [base[k] for k in keys] / table.iteration_time_s,
                                np.nan)
    table["incore_speedup"] = [base[k] / common.profile(m, b).incore_time_s
                               for k, m, b in zip(keys, table.model, table.batch)]
    return table


def plot(table: pd.DataFrame, path: Path) -> Path:
    """Grouped bars of the speed-ups, one panel per link (the paper's two figures)."""
    links = list(dict.fromkeys(table.link))
    models = list(dict.fromkeys(table.model))
    fig, axes = plt.subplots(1, len(links), figsize=(5.2 * len(links), 4.2), sharey=True,
                             squeeze=False)
    width = 0.8 / len(METHODS)
    for ax, link in zip(axes[0], links):
        for k, method in enumerate(METHODS):
            sel = table[(table.link == link) & (table.policy == method)].set_index("model")
            values = [sel.loc[m, "speedup"] for m in models]
            x = np.arange(len(models)) + (k - len(METHODS) / 2 + 0.5) * width
            bars = ax.bar(x, np.nan_to_num(values), width, color=common.STYLE[method][0],
                          label=LABELS[method])
            ax.bar_label(bars, [f"{v:.2f}" if np.isfinite(v) else "fails" for v in values],
                         fontsize=7, rotation=90, padding=2)
        for k, m in enumerate(models):   # the ceiling: in-core speed with no memory limit
            sel = table[(table.link == link) & (table.model == m)]
            ax.hlines(sel.incore_speedup.iloc[0], k - 0.45, k + 0.45, colors="black",
                      linestyles="--", lw=1, label="in-core, no memory limit" if k == 0 else None)
        ax.set_xticks(range(len(models)),
                      [f"{m}\nbatch {int(table[table.model == m].batch.iloc[0])}" for m in models])
        ax.set_title(f"{common.MACHINE.get(link, link)} ({link})")
        ax.axhline(1, color="gray", lw=0.8)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("speed-up over swap-all (w/o scheduling)")
    axes[0][0].set_ylim(0, np.nanmax(table[["speedup", "incore_speedup"]].to_numpy()) * 1.25)
    axes[0][-1].legend(fontsize=8, loc="upper right")
    fig.suptitle("Each optimization (paper Fig. 15 x86 / Fig. 16 POWER9), simulated V100 16 GB")
    return common.save(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__, OUT)
    ap.add_argument("--cases", nargs="+", type=common.case, default=[common.case(c) for c in CASES],
                    help="model:batch pairs (default %(default)s)")
    ap.add_argument("--links", nargs="+", type=common.link_name, default=list(common.PAPER_LINKS))
    args = ap.parse_args(argv)
    table = measure(args.cases, args.links, args.budget)
    csv = common.write_csv(table, args.out_dir / "fig15_16.csv")
    png = plot(table, args.out_dir / "fig15_16.png")
    print(common.markdown(common.by_policy(table, ["model", "batch", "link"], "speedup")))
    common.report([csv, png])
    return 0


if __name__ == "__main__":
    sys.exit(common.cli(main))
