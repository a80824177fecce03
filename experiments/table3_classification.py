"""Classification (the paper's Table 3): keep / swap / recompute counts, ResNet-50 batch 512.

PoocH and superneurons on x86 (pcie3) and POWER9 (nvlink2), simulated 16 GB V100, next to the
paper's counts; "pooch-paper" is PoocH's two steps without our refinement. Also writes every
plan's per-feature-map table (``Plan.to_csv``: class, bytes, swap and recompute seconds, r(X),
stall) and the classes per producing function, and draws the classes along the network depth,
so where each policy puts its swaps and recomputes can be seen, not only how many.

Writes <out>/table3.csv, <out>/table3_by_function.csv, <out>/plan_<policy>_<link>.csv and
<out>/table3.png.

    .venv/bin/python experiments/table3_classification.py [--model resnet50 --batch 512]
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
from matplotlib.patches import Patch
from tqdm import tqdm

import common
import matplotlib.pyplot as plt
from pooch_ext.profile import Profile

OUT = common.RESULTS / "table3"
POLICIES = ("pooch", "pooch-paper", "superneurons")
# Table 3 of the paper: (keep, swap, recompute); it ran the paper's PoocH steps
PAPER = {("pooch", "pcie3"): (66, 12, 27), ("superneurons", "pcie3"): (66, 21, 18),
         ("pooch", "nvlink2"): (66, 36, 3), ("superneurons", "nvlink2"): (66, 21, 18)}


def paper_counts(model: str, batch: int, policy: str,
                 link: str) -> tuple[int, int, int] | None:
    """The paper's (keep, swap, recompute) for this problem, policy and link, if it gives them
    (ResNet-50 batch 512 on pcie3 / nvlink2 only); both our PoocH variants sit beside its PoocH."""
    if (model, batch) != ("resnet50", 512):
        return None
    return PAPER.get(("pooch" if policy == "pooch-paper" else policy, link))


def classify_all(model: str, batch: int, links: list[str],
                 budget: str | int | None = None) -> tuple[Profile, dict, pd.DataFrame]:
    """Each (policy, link): its plan and its row with the paper's counts beside ours."""
    p = common.profile(model, batch)
    plans, rows = {}, []
    for link in tqdm(links, desc="table3", unit="link", leave=False):
        for policy in POLICIES:
            plan, r = common.run(p, policy, link, budget)
            paper = paper_counts(model, batch, policy, link)
            for cls, value in zip(("keep", "swap", "recompute"), paper or (None,) * 3):
                r[f"paper_{cls}"] = value
            rows.append(r)
            plans[policy, link] = plan
    return p, plans, pd.DataFrame(rows)


def by_function(plans: dict) -> pd.DataFrame:
    """How many maps of each producing function land in each class."""
    frames = []
    for (policy, link), plan in plans.items():
        if len(plan.table) and "function" in plan.table:
            counts = plan.table.groupby(["function", "class"]).size().unstack(fill_value=0)
            counts = counts.reindex(columns=list(common.CLASS_COLORS), fill_value=0)
            frames.append(counts.reset_index().assign(policy=policy, link=link))
    return pd.concat(frames, ignore_index=True)[["policy", "link", "function", "keep", "swap",
                                                 "recompute"]]


def plot(p: Profile, plans: dict, path: Path) -> None:
    """One strip per plan: each feature map (forward order) coloured by its class."""
    order = p.feature_maps.sort_values("tensor")
    position = {int(t): k for k, t in enumerate(order["tensor"])}
    width = (order["bytes"] / order["bytes"].max()).to_numpy()
    fig, ax = plt.subplots(figsize=(12, 0.55 * len(plans) + 1.6))
    labels = []
    for row, ((policy, link), plan) in enumerate(plans.items()):
        for tensor, cls in plan.classes.items():
            k = position[tensor]
            h = 0.3 + 0.5 * width[k]     # bar height grows with the map's bytes
            ax.bar(k, h, bottom=row - h / 2, width=0.9, color=common.CLASS_COLORS[cls])
        c = plan.counts
        labels.append(f"{policy} / {link}\n{c['keep']}/{c['swap']}/{c['recompute']}")
    ax.set_yticks(range(len(plans)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(-1, len(order))
    ax.set_xlabel("feature map, input side (left) to output side (right); height ~ bytes")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in common.CLASS_COLORS.items()],
              loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    model, batch = p.meta.get("model"), p.meta.get("batch")
    ax.set_title(f"{model} batch {batch}: class of every feature map (keep/swap/recompute)")
    common.save(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__, OUT)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--links", nargs="+", type=common.link_name, default=list(common.PAPER_LINKS))
    args = ap.parse_args(argv)
    p, plans, table = classify_all(args.model, args.batch, args.links, args.budget)
    paths = [common.write_csv(table, args.out_dir / "table3.csv"),
             common.write_csv(by_function(plans), args.out_dir / "table3_by_function.csv")]
    for (policy, link), plan in plans.items():
        paths.append(plan.to_csv(args.out_dir / f"plan_{policy}_{link}.csv"))
    paths.append(args.out_dir / "table3.png")
    plot(p, plans, paths[-1])
    print(common.markdown(table[["policy", "link", "keep", "swap", "recompute", "paper_keep",
                                 "paper_swap", "paper_recompute", "samples_per_s"]].round(1)))
    common.report(paths)
    return 0


if __name__ == "__main__":
    sys.exit(common.cli(main))
