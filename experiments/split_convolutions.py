"""Split convolutions on the im2col path (issue 14): the smallest budget any plan reaches
against batch, with and without splitting; PoocH's speed on a 16 GB V100 where only splits
make a plan possible; vDNN's VGG-16 batch 256 on 12 GB with vdnn-dyn.

Analytic profiles (``conv="im2col"``: Chainer + CuPy without cuDNN, what our executor runs) on
the cost model's v100-16gb over PCIe gen3. Split configurations are charged on the cost model's
GEMM-efficiency curve (pooch_ext/analytic/splits.py: a GEMM of F FLOPs runs at F / (F + H) of
the calibrated efficiency, H = 5 microseconds of peak work), so pieces are never free here.
ResNeXt-101 3D runs at batch 1 against its input (clips of 128 frames, H = W), the paper's 3D
case: there only the N-D splits over output rows, channel units and kernel offsets help.
"Without splitting" plans the same profile with every convolution whole
(``Profile.without_configs``). Writes results/splits/{minimum_budget,pooch_16gb,vdnn}.csv and
minimum_budget.png.
"""
from __future__ import annotations

import sys

import common
import pandas as pd

from pooch_ext.sim.budgets import minimum_budget

OUT = common.RESULTS / "splits"
GiB = 1 << 30
SWEEPS = {"vgg16": [32, 64, 128, 192, 256], "alexnet": [256, 512, 1024, 2048, 2432],
          "resnet50": [32, 64, 128, 192, 256]}
# ResNeXt-101 3D at batch 1 against its input: clips of 128 frames, H = W = side
RESNEXT, RESNEXT_SIDES = "resnext101-3d", [224, 320, 448, 576, 704]
TARGETS = [("vgg16", 256, None), ("alexnet", 2432, None), ("resnet50", 256, None),
           (RESNEXT, 1, "3x128x448x448")]
# the papers' own numbers beside ours
VDNN_PAPER = "vDNN (cuDNN, Titan X 12 GB): VGG-16 b256 needs 28 GB in-core, runs on 12 GB at 18% loss"


def _profile(model: str, batch: int, input_size: str | None = None):
    return common.profile(model, batch, input_size, gpu=common.PAPER_GPU, conv="im2col")


def minimum_budgets() -> pd.DataFrame:
    """Smallest budgets against batch (2D networks) and input side (ResNeXt-101 3D)."""
    cases = [(model, batch, None, batch) for model, batches in SWEEPS.items()
             for batch in batches]
    cases += [(RESNEXT, 1, f"3x128x{side}x{side}", side) for side in RESNEXT_SIDES]
    rows = []
    for model, batch, input_size, x in cases:
        p = _profile(model, batch, input_size)
        rows.append({"model": model, "batch": batch, "input_size": input_size or "",
                     "x": x, "incore_gib": p.incore_peak_bytes / GiB,
                     "minimum_split_gib": minimum_budget(p) / GiB,
                     "minimum_whole_gib": minimum_budget(p.without_configs()) / GiB})
    return pd.DataFrame(rows)


def pooch_16gb() -> pd.DataFrame:
    rows = []
    for model, batch, input_size in TARGETS:
        p = _profile(model, batch, input_size)
        for label, profile in (("split", p), ("whole", p.without_configs())):
            plan, row = common.run(profile, "pooch", "pcie3")
            row.update(splitting=label, split_ops=len(plan.configs),
                       relative=row["samples_per_s"] / row["incore_unlimited_samples_per_s"])
            rows.append(row)
    return pd.DataFrame(rows)


def vdnn() -> pd.DataFrame:
    p = _profile("vgg16", 256)
    rows = []
    for policy in ("vdnn-dyn", "vdnn-all", "vdnn-conv", "pooch"):
        plan, row = common.run(p, policy, "pcie3", "12GiB")
        row.update(split_ops=len(plan.configs),
                   loss_vs_incore=1 - row["samples_per_s"] / row["incore_unlimited_samples_per_s"]
                   if row["feasible"] else float("nan"))
        rows.append(row)
    return pd.DataFrame(rows)


def plot(table: pd.DataFrame, path) -> None:
    models = list(dict.fromkeys(table.model))
    fig, axes = common.plt.subplots(1, len(models), figsize=(4 * len(models), 3.2))
    for ax, (model, part) in zip(axes, table.groupby("model", sort=False)):
        ax.plot(part.x, part.incore_gib, "k-o", label="in-core")
        ax.plot(part.x, part.minimum_whole_gib, "s--", label="smallest, whole convs")
        ax.plot(part.x, part.minimum_split_gib, "D-", label="smallest, split convs")
        ax.axhline(16160 / 1024, color="gray", lw=0.8, ls=":")
        ax.set(title=model if model != RESNEXT else f"{model}, batch 1",
               xlabel="batch" if model != RESNEXT else "H = W (128 frames)", ylabel="GiB")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    args = common.parser(__doc__, OUT).parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    minimum = minimum_budgets()
    minimum.to_csv(args.out_dir / "minimum_budget.csv", index=False)
    plot(minimum, args.out_dir / "minimum_budget.png")
    fast = pooch_16gb()
    fast.to_csv(args.out_dir / "pooch_16gb.csv", index=False)
    dyn = vdnn()
    dyn.to_csv(args.out_dir / "vdnn.csv", index=False)
    print(minimum.round(2).to_string(index=False))
    print(fast[["model", "batch", "input_size", "splitting", "feasible", "samples_per_s", "relative",
                "split_ops"]].round(3).to_string(index=False))
    print(dyn[["policy", "feasible", "samples_per_s", "loss_vs_incore", "split_ops"]]
          .round(3).to_string(index=False))
    print(VDNN_PAPER)
    return 0


if __name__ == "__main__":
    sys.exit(main())
