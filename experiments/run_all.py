"""Regenerate every experiment in results/ (``make experiments``), with a progress bar.

Runs, in this order and in one process (analytic traces are shared): the ResNet-50 memory
curve (Figure 3), each optimization (Figures 15/16), the batch sweep (Figures 17-20), the
classification table (Table 3), ResNeXt-101 3D (Figures 21/22) and the beyond-the-paper
sweeps. Each writes its CSV and PNG files into its own folder under the output folder; the
seconds each took go to <out>/run_all.csv (full runs only). About 3-4 minutes on a 2-core machine.

    .venv/bin/python experiments/run_all.py [--out-dir results] [--only fig15_16 table3 ...]
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import sys
import time
from pathlib import Path

import pandas as pd
from tqdm import tqdm

import common

# name -> (module, folder under the output folder; "" for the top level)
EXPERIMENTS = {
    "resnet50_memory": ("resnet50_memory", ""),
    "fig15_16": ("fig15_16_each_optimization", "fig15_16"),
    "fig17_20": ("fig17_20_batch_sweep", "fig17_20"),
    "table3": ("table3_classification", "table3"),
    "fig21_22": ("fig21_22_resnext3d", "fig21_22"),
    "beyond": ("beyond_paper", "beyond"),
    "splits": ("split_convolutions", "splits"),
    "data_parallel": ("data_parallel_scaling", "data_parallel"),
    "gist": ("gist_encodings", "gist"),
}


def run(names: list[str], out: Path, quiet: bool = False) -> pd.DataFrame:
    """Run the named experiments' ``main`` into ``out``; their seconds, one row each."""
    rows = []
    bar = tqdm(names, desc="experiments", unit="exp")
    for name in bar:
        bar.set_postfix_str(name)
        module_name, folder = EXPERIMENTS[name]
        module = importlib.import_module(module_name)
        started = time.perf_counter()
        sink = io.StringIO() if quiet else None
        with contextlib.redirect_stdout(sink) if quiet else contextlib.nullcontext():
            status = module.main(["--out-dir", str(out / folder if folder else out)])
        rows.append({"experiment": name, "script": f"experiments/{module_name}.py",
                     "seconds": round(time.perf_counter() - started, 1), "status": status})
        if status:
            raise SystemExit(f"{name} failed with status {status}")
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", type=Path, default=common.RESULTS)
    ap.add_argument("--only", nargs="+", choices=list(EXPERIMENTS), default=list(EXPERIMENTS))
    ap.add_argument("--quiet", action="store_true", help="hide the experiments' printed tables")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    times = run(args.only, args.out_dir, args.quiet)
    total = time.perf_counter() - started
    times = pd.concat([times, pd.DataFrame([{"experiment": "total", "script": "run_all.py",
                                             "seconds": round(total, 1), "status": 0}])])
    if args.only == list(EXPERIMENTS):   # a partial run keeps the full run's timings
        common.write_csv(times, args.out_dir / "run_all.csv")
    print(common.markdown(times))
    print(f"all experiments done in {total / 60:.1f} min; results in {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(common.cli(main))
