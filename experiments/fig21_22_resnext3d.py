"""ResNeXt-101 3D (the paper's Figures 21 and 22, with Figure 4's memory): input-size sweep.

Batch 1 on the simulated 16 GB V100, x86 (pcie3) and POWER9 (nvlink2), for in-core,
superneurons and PoocH ("pooch-paper": its two steps alone). The paper gives no input sizes,
only that Figure 4's memory reaches 58 GB at the largest; ours are clips of 128 frames at
H = W = 224, 256, ..., 704 (in-core 6.6 GB to 63 GB), from fitting in 16 GB to about 60 GB.
Speeds are shown relative to in-core without a memory limit (the paper's "within 10% of
in-core" reads off directly); the CSV has clips/s too.

Our memory model cannot run the largest clips in 16 GB with any plan: the stem's
BatchNormalization backward holds its input, the incoming gradient and two temporaries of the
stem's output size (64 x T x H/2 x W/2 floats) at once, so the minimum any plan reaches is
about 36% of the in-core peak. Those points are marked as failures for every method.

Writes <out>/fig21_22.csv, <out>/fig21_22_summary.csv and <out>/fig21_22.png.

    .venv/bin/python experiments/fig21_22_resnext3d.py [--frames 128] [--sides 224:705:32]
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

import common
import matplotlib.pyplot as plt

OUT = common.RESULTS / "fig21_22"
MODEL = "resnext101-3d"
POLICIES = ("in-core", "superneurons", "pooch-paper", "pooch")
GB = 1e9


def sizes(frames: int, sides: list[int]) -> list[str]:
    """Input sizes '3xTxHxW' of clips of ``frames`` frames with H = W in ``sides``."""
    return [f"3x{frames}x{s}x{s}" for s in sides]


def sweep(input_sizes, links, budget=None, gpu=common.PAPER_GPU, conv=common.PAPER_CONV,
          model=MODEL, batch=1, desc="fig21/22") -> pd.DataFrame:
    """Every policy on every (input size, link); ``relative`` = speed / in-core unlimited."""
    rows = []
    jobs = [(s, link) for s in input_sizes for link in links]
    for size, link in tqdm(jobs, desc=desc, unit="case", leave=False):
        p = common.profile(model, batch, size, gpu, conv)
        for policy in POLICIES:
            rows.append(common.run(p, policy, link, budget)[1])
    table = common.with_relative(pd.DataFrame(rows))
    table["voxels"] = [int(np.prod([int(v) for v in s.split("x")[1:]])) for s in table.input_size]
    return table


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per link: the worst PoocH and superneurons relative speed where in-core fails."""
    rows = []
    for link, sel in table.groupby("link", sort=False):
        over = sel[sel.input_size.isin(sel[(sel.policy == "in-core") & ~sel.feasible].input_size)]
        row = {"link": link, "sizes_over_capacity": over.input_size.nunique()}
        for policy in ("pooch", "pooch-paper", "superneurons"):
            runs = over[(over.policy == policy) & over.feasible]
            row[f"{policy}_runs"] = len(runs)
            row[f"{policy}_worst_relative"] = runs.relative.min() if len(runs) else np.nan
            row[f"{policy}_largest_incore_gb"] = (runs.incore_peak_bytes.max() / GB
                                                  if len(runs) else np.nan)
        rows.append(row)
    return pd.DataFrame(rows)


def plot(table: pd.DataFrame, path: Path, title: str) -> None:
    """Memory against input size, then relative speed per link (the paper's two figures)."""
    links = list(dict.fromkeys(table.link))
    fig, axes = plt.subplots(1, 1 + len(links), figsize=(4.8 * (1 + len(links)), 4.3),
                             squeeze=False)
    mem = table.drop_duplicates("input_size")
    x = mem.incore_peak_bytes / GB
    ax = axes[0][0]
    ax.plot(mem.voxels / 1e6, x, "o-", color="black", label="in-core peak")
    ax.plot(mem.voxels / 1e6, mem.minimum_bytes / GB, "s--", color="gray",
            label="minimum any plan reaches")
    ax.axhline(mem.budget_bytes.iloc[0] / GB, color="red", lw=0.8, ls=":", label="budget")
    ax.set_xlabel("input voxels per clip (millions)")
    ax.set_ylabel("GB")
    ax.set_title("memory (cf. paper Fig. 4)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    for ax, link in zip(axes[0][1:], links):
        sel = table[table.link == link].assign(peak_gb=lambda d: d.incore_peak_bytes / GB)
        common.plot_methods(ax, sel, x="peak_gb", y="relative", y_unlimited="relative_unlimited")
        ax.axhline(0.9, color="gray", lw=0.8, ls="-.", label="paper: PoocH within 10%")
        ax.set_title(f"{common.MACHINE.get(link, link)} ({link})")
        ax.set_xlabel("in-core memory of the problem (GB)")
        ax.set_ylim(0, 1.08)
        ax.grid(alpha=0.3)
    axes[0][1].set_ylabel("speed / in-core without memory limit")
    axes[0][-1].legend(fontsize=7, loc="lower left")
    fig.suptitle(title)
    common.save(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__, OUT)
    ap.add_argument("--frames", type=int, default=128, help="clip length T (default 128)")
    ap.add_argument("--sides", type=common.ints, default=list(range(224, 705, 32)),
                    help="H = W values (default 224..704 step 32)")
    ap.add_argument("--links", nargs="+", type=common.link_name, default=list(common.PAPER_LINKS))
    args = ap.parse_args(argv)
    table = sweep(sizes(args.frames, args.sides), args.links, args.budget)
    summ = summary(table)
    paths = [common.write_csv(table, args.out_dir / "fig21_22.csv"),
             common.write_csv(summ, args.out_dir / "fig21_22_summary.csv"),
             args.out_dir / "fig21_22.png"]
    plot(table, paths[-1], "ResNeXt-101 3D, batch 1, simulated V100 16 GB "
                           "(paper Fig. 21 x86 / Fig. 22 POWER9)")
    print(common.markdown(common.by_policy(table, ["input_size", "link"], "relative")))
    print(common.markdown(summ.round(3)))
    common.report(paths)
    return 0


if __name__ == "__main__":
    sys.exit(common.cli(main))
