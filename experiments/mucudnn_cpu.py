"""mu-cuDNN's comparisons (papers/mu-cudnn.txt, Figs. 10-12) on measured CPU split timings.

mu-cuDNN divides each convolution into micro-batches so that faster algorithms fit a workspace
limit: WR gives every kernel the same limit, WD one total for all (an integer program). On
Chainer's im2col path the only "algorithm" is the split itself: whole needs the full column
buffer, pieces need a fraction of it and, on a CPU, often run faster (the pieces' GEMMs stay
in cache). Each network is profiled on the CPU device (``measured_profile``: the split
configurations of every convolution measured on probes, seconds and counted scratch), then,
per workspace limit:

* ``undivided``: every kernel whole (cuDNN's choice without mu-cuDNN): runs only where the
  limit holds each kernel's whole scratch;
* ``wr``: each kernel's fastest configuration within the limit;
* ``wd``: the fastest configurations whose scratch sums within limit x kernels (the same total
  memory as WR's limit, the paper's adjoined bars).

Convolution seconds are the profile's (forward + both backward kernels). Measured timings
vary run to run on a shared machine; the profiles are saved beside the table, and
``--profiles DIR`` recomputes the table from saved ones. Writes <out>/mucudnn.csv, .png and
profiles/<model>_b<batch>/. Not part of ``make experiments``: measuring takes minutes.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python experiments/mucudnn_cpu.py [--cases alexnet:16 resnet18:16]
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import common
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from pooch_ext.policies import mucudnn
from pooch_ext.profile import Profile

OUT = common.RESULTS / "mucudnn"
CASES = ("alexnet:16", "resnet18:16")
MiB = 1 << 20
# the paper's speed-ups of convolutions alone (P100-SMX2, cuDNN 7)
PAPER = {"alexnet": "1.63x with WR at 64 MiB per kernel (all), 1.38x with WD at 120 MiB total",
         "resnet18": "1.21x with WR at 64 MiB per kernel (all)"}


def limits(table: dict) -> list[int]:
    """Per-kernel limits from the least any split reaches to the largest whole scratch, in
    powers of two (both ends included)."""
    low = max(min(c[1] for c in configs) for configs in table.values())
    high = max(configs[0][1] for configs in table.values())
    grid = [2 ** k for k in range(max(0, math.ceil(math.log2(max(low, 1)))),
                                  math.ceil(math.log2(max(high, 1))) + 1)]
    return sorted({max(low, 1), *grid, high})


def _seconds(profile: Profile, limit: int, mode: str) -> float:
    try:
        return mucudnn.conv_seconds(profile, mucudnn.choose(profile, limit, mode))
    except ValueError:          # no choice meets the limit
        return math.nan


def compare(profile: Profile, model: str, batch: int) -> pd.DataFrame:
    """One row per per-kernel limit: undivided, WR and WD convolution seconds."""
    table = mucudnn.options(profile)
    whole = sum(configs[0][2] for configs in table.values())
    rows = []
    for limit in limits(table):
        fits_whole = all(configs[0][1] <= limit for configs in table.values())
        rows.append(dict(model=model, batch=batch, kernels=len(table), limit_mib=limit / MiB,
                         undivided_s=whole if fits_whole else math.nan,
                         wr_s=_seconds(profile, limit, "wr"),
                         wd_s=_seconds(profile, limit * len(table), "wd")))
    frame = pd.DataFrame(rows)
    for mode in ("wr", "wd"):
        frame[f"{mode}_speedup"] = whole / frame[f"{mode}_s"]
    return frame


def plot(frame: pd.DataFrame, path: Path) -> None:
    models = list(dict.fromkeys(frame.model))
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        sel = frame[frame.model == model]
        for column, label, style in (("undivided_s", "undivided (whole)", "o-"),
                                     ("wr_s", "WR (per-kernel limit)", "s-"),
                                     ("wd_s", "WD (limit x kernels in total)", "^-")):
            ax.plot(sel.limit_mib, sel[column], style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workspace limit per kernel (MiB)")
        ax.set_ylabel("convolution seconds per iteration")
        ax.set_title(f"{model} b{int(sel.batch.iloc[0])} on the CPU device (measured)")
        ax.grid(alpha=0.3)
        ax.legend()
    common.save(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__, OUT)
    parser.add_argument("--cases", nargs="+", default=list(CASES), help="model:batch ...")
    parser.add_argument("--iters", type=int, default=3, help="profiled iterations")
    parser.add_argument("--profiles", type=Path, default=None,
                        help="read <dir>/<model>_b<batch> instead of measuring")
    args = parser.parse_args(argv)
    from pooch_ext.measure import measured_profile

    args.out_dir.mkdir(parents=True, exist_ok=True)
    frames = []
    for text in args.cases:
        model, _, batch_text = text.partition(":")
        batch = common.ints(batch_text)[0]
        name = f"{model}_b{batch}"
        if args.profiles is not None:
            profile = Profile.load(args.profiles / name)
        else:
            profile = measured_profile(model, batch, gpu=False, link="cpu", iters=args.iters)
            profile.save(args.out_dir / "profiles" / name)
        frames.append(compare(profile, model, batch))
    frame = pd.concat(frames, ignore_index=True)
    common.write_csv(frame, args.out_dir / "mucudnn.csv")
    plot(frame, args.out_dir / "mucudnn.png")
    print(frame.round(3).to_string(index=False))
    for model in dict.fromkeys(frame.model):
        sel = frame[frame.model == model]
        best = float(np.nanmax(sel.wr_speedup))
        print(f"{model}: splits speed the convolutions up {best:.2f}x over undivided at the "
              f"largest limit; paper: {PAPER.get(model, '-')}")
    return 0


if __name__ == "__main__":
    sys.exit(common.cli(main))
