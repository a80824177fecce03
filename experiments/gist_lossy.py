"""What fp16 and fp8 stashes (Gist's delayed precision reduction, ``PoocH(encodings="lossy")``
and ``"lossy-fp8"``) do to training, measured on the CPU device (issue 16).

The same network, data and seed trained four times: plain Chainer, PoocH with lossless
encodings, with fp16 stashes and with fp8 ones (Gist's 1-4-3 format). The PoocH runs use the
swap-all policy over a slow emulated link (5 MB/s), where every encoding pays for itself, so
the plan stores every map it can encoded: the worst case for the lossy runs (with pooch's
own plan, fewer maps are encoded, or none). The forward pass is unchanged by construction
(maps are encoded after their last forward use), so only the gradients see fp16 / fp8 values.
The data is the demo's teacher task (labels a fixed linear map of the pooled pixels
decides), so the loss falls.

Writes <out>/lossy.csv (loss per iteration of each run) and <out>/lossy.png, and prints which
maps were encoded how, whether the lossless run is bit-identical to plain, and how far the
lossy runs' losses drift.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python experiments/gist_lossy.py [--iters 300] [--out-dir ...]

Not part of ``make experiments``: it trains for real (about half a minute).
"""
from __future__ import annotations

import sys

import chainer
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

import common
from pooch_ext.demo import teacher_batches
from pooch_ext.hooks.cpu_device import CpuDevice
from pooch_ext.links import Link
from pooch_ext.testing import ConvNet, model_state, states_equal, train

OUT = common.RESULTS / "gist"
SLOW = Link("slow", 5e6, 5e6)
CLASSES = 10
SETTINGS = ("lossless", "lossy", "lossy-fp8")


def run(batches: list, lr: float, pooch: dict | None = None) -> tuple:
    """One training run from seed 0 with MomentumSGD(lr): its result and final state."""
    np.random.seed(0)
    model = ConvNet(CLASSES)
    optimizer = chainer.optimizers.MomentumSGD(lr)
    optimizer.setup(model)
    result = train(model, optimizer, batches, pooch)
    if result.error is not None:
        raise result.error
    return result, model_state(model, optimizer)


def losses(iters: int, batch: int, side: int, lr: float) -> tuple[pd.DataFrame, dict]:
    batches = teacher_batches(iters, batch, (3, side, side), CLASSES)
    plain, plain_state = run(batches, lr)
    table = pd.DataFrame({"iteration": range(iters), "plain": plain.losses})
    info = {}
    for setting in SETTINGS:
        under, state = run(batches, lr, dict(
            profile_iters=2, verbose=False, device=CpuDevice(), policy="swap-all",
            encodings=setting, link=SLOW))
        table[setting] = under.losses
        info[setting] = dict(encodings=under.pooch.plan.encodings,
                             identical=states_equal(plain_state, state)
                             and under.losses == plain.losses)
    return table, info


def plot(table: pd.DataFrame, path) -> None:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.5, 5), sharex=True)
    for column, style in (("plain", "-"), ("lossless", "--"), ("lossy", ":"),
                          ("lossy-fp8", "-.")):
        top.plot(table.iteration, table[column], style,
                 label={"lossy": "fp16", "lossy-fp8": "fp8"}.get(column, column))
    top.set_ylabel("training loss")
    top.legend()
    for column, color in (("lossy", "tab:red"), ("lossy-fp8", "tab:purple")):
        bottom.plot(table.iteration, table[column] - table.plain, color=color,
                    label={"lossy": "fp16", "lossy-fp8": "fp8"}[column])
    bottom.axhline(0.0, color="black", lw=0.8)
    bottom.set_ylabel("stash - plain")
    bottom.set_xlabel("iteration")
    bottom.legend()
    top.set_title("fp16 and fp8 stashes (Gist's DPR) on the CPU device")
    common.save(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__, OUT)
    ap.add_argument("--iters", type=int, default=300, help="iterations (default %(default)s)")
    ap.add_argument("--batch", type=int, default=16, help="batch size (default %(default)s)")
    ap.add_argument("--lr", type=float, default=0.01,
                    help="MomentumSGD's learning rate (default %(default)s)")
    ap.add_argument("--side", type=int, default=16,
                    help="image side, a multiple of 4 (default %(default)s)")
    args = ap.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    table, info = losses(args.iters, args.batch, args.side, args.lr)
    table.to_csv(args.out_dir / "lossy.csv", index=False)
    plot(table, args.out_dir / "lossy.png")
    for setting, what in info.items():
        print(f"{setting}: encodings {what['encodings']}; bit-identical to plain: "
              f"{what['identical']}")
    tail = max(1, len(table) // 10)
    for column in ("lossy", "lossy-fp8"):
        drift = (table[column] - table.plain).abs()
        print(f"{column} - plain: largest |difference| {drift.max():.2e}")
    print(f"mean loss over the last {tail} iterations: " + ", ".join(
        f"{c} {table[c].iloc[-tail:].mean():.4f}" for c in ("plain",) + SETTINGS))
    return 0 if info["lossless"]["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
