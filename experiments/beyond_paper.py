"""Beyond the paper: today's hosts and link speed (classification time against depth:
experiments/planner_scale.py).

1. ``hosts``: the ResNet-50 batch sweep and the ResNeXt-101 3D input-size sweep on an H100
   (cost-model preset ``h100``: 80 GB, 67 TFLOP/s FP32, 3.35 TB/s) behind PCIe gen5 (63 GB/s)
   and behind NVLink-C2C (450 GB/s, the Grace-Hopper link), sizes chosen to need up to ~3x
   the 80 GB. Convolutions are charged as cuDNN, as in the paper's reproduction, so the only
   change from Figures 17-22 is the hardware (our executor runs im2col on CuPy 14, which
   moves ~4x the column buffer and would slow every method alike; ``--conv im2col`` shows it).
2. ``bandwidth``: the keep / swap / recompute mix of PoocH as the link gets faster relative to
   compute: ResNet-50 at 2.5x the memory (V100 batch 512, H100 batch 2432), link bandwidth
   4..512 GB/s per direction. The x axis of the right-hand plots is the link-to-compute ratio
   R = bandwidth x in-core iteration time / feature-map bytes: how many times the link could
   carry every feature map during one in-core iteration; if R is what matters, both GPUs fall
   on one curve.

Writes <out>/hosts.csv + hosts.png, <out>/bandwidth.csv + bandwidth.png.

    .venv/bin/python experiments/beyond_paper.py [--parts hosts bandwidth]
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
from tqdm import tqdm

import common
import fig17_20_batch_sweep as batch_sweep
import fig21_22_resnext3d as resnext
import matplotlib.pyplot as plt
from pooch_ext.links import PRESETS, Link

OUT = common.RESULTS / "beyond"
GPU = "h100"
HOST_LINKS = ("pcie5", "c2c")
GB = 1e9
BANDWIDTH_CASES = (("v100-16gb", 512), ("h100", 2432))


# ---------------------------------------------------------------- 1. today's hosts
def hosts(batches: list[int], sides: list[int], links: list[str], conv: str,
          budget: str | int | None = None) -> pd.DataFrame:
    """The ResNet-50 batch sweep and the ResNeXt-101 3D size sweep on the H100."""
    rn = batch_sweep.sweep({"resnet50": batches}, links, budget, gpu=GPU, conv=conv,
                           desc="hosts: resnet50")
    rx = resnext.sweep(resnext.sizes(128, sides), links, budget, gpu=GPU, conv=conv,
                       desc="hosts: resnext3d")
    return pd.concat([rn, rx.drop(columns="voxels")], ignore_index=True)


def plot_hosts(table: pd.DataFrame, path: Path) -> None:
    """Relative speed against in-core memory, one panel per (network, link)."""
    models = list(dict.fromkeys(table.model))
    links = list(dict.fromkeys(table.link))
    fig, axes = plt.subplots(len(models), len(links), figsize=(5.4 * len(links),
                                                               3.9 * len(models)),
                             squeeze=False, sharey=True)
    for r, model in enumerate(models):
        for c, link in enumerate(links):
            ax = axes[r][c]
            sel = table[(table.model == model) & (table.link == link)].assign(
                peak_gb=lambda d: d.incore_peak_bytes / GB)
            common.plot_methods(ax, sel, x="peak_gb", y="relative",
                                y_unlimited="relative_unlimited")
            ends = sel.drop_duplicates("peak_gb").sort_values("peak_gb")
            first, last = ends.iloc[0], ends.iloc[-1]
            span = (f"batch {first.batch} .. {last.batch}" if model == "resnet50" else
                    f"input {first.input_size} .. {last.input_size}")
            ax.set_title(f"{model} on {GPU} + {common.MACHINE.get(link, link)}\n{span}",
                         fontsize=9)
            ax.set_xlabel("in-core memory of the problem (GB)")
            ax.axvline(first.budget_bytes / GB, color="red", lw=0.8, ls=":")
            ax.set_ylim(0, 1.08)
            ax.grid(alpha=0.3)
        axes[r][0].set_ylabel("speed / in-core without memory limit")
    axes[0][-1].legend(fontsize=7, loc="lower left")
    fig.suptitle(f"Today's hosts: simulated {GPU} (80 GB), {table.conv.iloc[0]} convolutions; "
                 "red dotted line: GPU capacity")
    common.save(fig, path)


# ---------------------------------------------------------------- 2. link bandwidth
def bandwidth(gbps: list[float], cases=BANDWIDTH_CASES,
              budget: str | int | None = None) -> pd.DataFrame:
    """PoocH's and superneurons' plans as the link's bandwidth grows, with class fractions.
    PoocH's come from one sweep over the links (policies/sweep.py), so a faster link never
    shows a slower plan: classified one link at a time, H100 batch 2432 was 0.27% slower
    at 8 GB/s than at 4."""
    rows = []
    for gpu, batch in tqdm(cases, desc="bandwidth", unit="case", leave=False):
        p = common.profile("resnet50", batch, None, gpu)
        links = [Link(f"{g:g}GB/s", g * GB, g * GB) for g in gbps]
        swept = common.classify_links(p, links, budget)
        for g, link, plan in zip(gbps, links, swept):
            extra = {"gbps": g, "link_compute_ratio": g * GB * p.incore_time_s / p.feature_map_bytes}
            rows.append(common.run(p, "superneurons", link, budget, **extra)[1])
            rows.append(common.row(p, plan, link, budget, **extra))
    table = common.with_relative(pd.DataFrame(rows))
    total = table[["keep", "swap", "recompute"]].sum(axis=1)
    for cls in ("keep", "swap", "recompute"):
        table[f"{cls}_fraction"] = table[cls] / total
    return table


def plot_bandwidth(table: pd.DataFrame, path: Path) -> None:
    """The class mix against bandwidth per GPU, then against the link-to-compute ratio."""
    gpus = list(dict.fromkeys(table.gpu))
    fig, axes = plt.subplots(2, max(2, len(gpus)), figsize=(11, 7.5), squeeze=False)
    pooch = table[table.policy == "pooch"]
    for ax, gpu in zip(axes[0], gpus):
        sel = pooch[pooch.gpu == gpu].sort_values("gbps")
        ax.stackplot(sel.gbps, [sel[f"{c}_fraction"] for c in common.CLASS_COLORS],
                     colors=list(common.CLASS_COLORS.values()), labels=list(common.CLASS_COLORS))
        for name, link in PRESETS.items():
            bw = link.d2h_bytes_per_s / GB
            if sel.gbps.min() <= bw <= sel.gbps.max():
                ax.axvline(bw, color="white", lw=1, ls="--")
                ax.text(bw, 1.01, name, rotation=90, fontsize=6, ha="center", va="bottom")
        ax.set_xscale("log")
        ax.set_ylim(0, 1)
        ax.set_xlabel("link bandwidth per direction (GB/s)")
        ax.set_title(f"PoocH classes, resnet50 b{sel.batch.iloc[0]} on {gpu}", pad=26,
                     fontsize=9)
    axes[0][0].set_ylabel("fraction of feature maps")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    markers = dict(zip(gpus, "os^"))
    for gpu in gpus:
        sel = pooch[pooch.gpu == gpu].sort_values("link_compute_ratio")
        for cls in ("swap", "recompute"):
            axes[1][0].plot(sel.link_compute_ratio, sel[f"{cls}_fraction"],
                            marker=markers[gpu], color=common.CLASS_COLORS[cls],
                            label=f"{cls}, {gpu}", ls="-" if gpu == gpus[0] else "--")
        for policy in ("pooch", "superneurons"):
            part = table[(table.gpu == gpu) & (table.policy == policy)].sort_values(
                "link_compute_ratio")
            axes[1][1].plot(part.link_compute_ratio, part.relative, marker=markers[gpu],
                            color=common.STYLE[policy][0], ls="-" if gpu == gpus[0] else "--",
                            label=f"{policy}, {gpu}")
    for ax in axes[1]:
        ax.set_xscale("log")
        ax.set_xlabel("R = bandwidth x in-core time / feature-map bytes")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    axes[1][0].set_ylabel("fraction of feature maps")
    axes[1][1].set_ylabel("speed / in-core without memory limit")
    axes[1][1].set_ylim(0, 1.05)
    fig.suptitle("How the mix moves as the link gets faster relative to compute "
                 "(ResNet-50 at 2.5x the GPU memory)")
    common.save(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__, OUT)
    ap.add_argument("--parts", nargs="+", default=["hosts", "bandwidth"],
                    choices=["hosts", "bandwidth"])
    ap.add_argument("--batches", type=common.ints, default=list(range(512, 4097, 512)),
                    help="ResNet-50 batches on the H100 (default 512..4096)")
    ap.add_argument("--sides", type=common.ints, default=list(range(448, 1345, 128)),
                    help="ResNeXt-101 3D H = W with 128 frames on the H100 (default 448..1344)")
    ap.add_argument("--links", nargs="+", type=common.link_name, default=list(HOST_LINKS))
    ap.add_argument("--conv", default=common.PAPER_CONV, choices=["cudnn", "im2col"])
    ap.add_argument("--gbps", type=float, nargs="+",
                    default=[4, 8, 12, 16, 24, 32, 48, 63, 75, 96, 128, 192, 256, 450],
                    help="link bandwidths per direction, GB/s")
    args = ap.parse_args(argv)
    paths = []
    if "hosts" in args.parts:
        table = hosts(args.batches, args.sides, args.links, args.conv, args.budget)
        paths.append(common.write_csv(table, args.out_dir / "hosts.csv"))
        paths.append(args.out_dir / "hosts.png")
        plot_hosts(table, paths[-1])
        print(common.markdown(common.by_policy(table, ["model", "batch", "input_size", "link"],
                                               "relative")))
    if "bandwidth" in args.parts:
        table = bandwidth(args.gbps, budget=args.budget)
        paths.append(common.write_csv(table, args.out_dir / "bandwidth.csv"))
        paths.append(args.out_dir / "bandwidth.png")
        plot_bandwidth(table, paths[-1])
        cols = ["gpu", "gbps", "link_compute_ratio", "policy", "keep", "swap", "recompute",
                "relative"]
        print(common.markdown(table[cols].round(3)))
    common.report(paths)
    return 0


if __name__ == "__main__":
    sys.exit(common.cli(main))
