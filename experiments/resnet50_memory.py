"""ResNet-50 in-core memory vs batch size (the paper's Figure 3), from analytic profiles.

Writes results/resnet50_memory.csv (batch 64..640 step 64) and results/resnet50_memory.png,
and prints the markdown table. The paper: batch 256 and above exceed the 16 GB V100, batch
640 needs more than 50 GB (sec. 2.2, 5.2).

    .venv/bin/python experiments/resnet50_memory.py [--gpu v100-16gb] [--out-dir results]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from tqdm import tqdm  # noqa: E402

from common import RESULTS, markdown  # noqa: E402
from pooch_ext.analytic.tracing import analytic_profile  # noqa: E402

GIB, GB = 1 << 30, 1e9
BATCHES = range(64, 641, 64)


def memory_table(gpu: str = "v100-16gb", batches=BATCHES) -> pd.DataFrame:
    """One row per batch: in-core peak, feature maps and resident bytes (and GiB)."""
    rows = []
    for batch in tqdm(batches, desc="resnet50 profiles", unit="batch"):
        p = analytic_profile("resnet50", batch, gpu=gpu)
        rows.append({"batch": batch, "incore_peak_bytes": p.incore_peak_bytes,
                     "feature_map_bytes": p.feature_map_bytes, "resident_bytes": p.resident_bytes,
                     "capacity_bytes": p.device.capacity_bytes})
    table = pd.DataFrame(rows)
    for column in ("incore_peak", "feature_map", "resident"):
        table[f"{column}_gib"] = (table[f"{column}_bytes"] / GIB).round(2)
    table["incore_peak_gb"] = (table["incore_peak_bytes"] / GB).round(2)
    table["fits"] = table["incore_peak_bytes"] <= table["capacity_bytes"]
    return table


def plot(table: pd.DataFrame, path: Path, gpu: str) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(table.batch, table.incore_peak_bytes / GB, "o-", label="in-core peak (analytic)")
    ax.plot(table.batch, table.feature_map_bytes / GB, "s--", label="feature maps")
    ax.axhline(table.capacity_bytes.iloc[0] / GB, color="gray", ls=":", label=f"{gpu} capacity")
    ax.plot([640], [50], "r*", ms=12, label="paper: >50 GB at batch 640")
    ax.set_xlabel("batch size")
    ax.set_ylabel("GPU memory (GB, 1e9 bytes)")
    ax.set_title("ResNet-50 training memory vs batch size")
    ax.set_xticks(list(table.batch))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", default="v100-16gb")
    parser.add_argument("--out-dir", default=str(RESULTS))
    args = parser.parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = memory_table(args.gpu)
    table.to_csv(out / "resnet50_memory.csv", index=False)
    plot(table, out / "resnet50_memory.png", args.gpu)
    print(markdown(table[["batch", "incore_peak_gib", "incore_peak_gb", "feature_map_gib",
                          "resident_gib", "fits"]]))
    print(f"wrote {out / 'resnet50_memory.csv'} and {out / 'resnet50_memory.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
