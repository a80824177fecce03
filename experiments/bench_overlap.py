"""Do the CPU device's copies really run beside compute? Compute alone, copies alone, both.

Issue 12: NumPy's copies and BLAS release the GIL, so the copy engines (worker threads) should
overlap a training step's compute on two cores as a GPU's copy engines overlap its kernels.
Three phases, interleaved over ``--rounds`` rounds (medians), BLAS pinned to one thread:

* compute: ``--ops`` matrix products of ``--n`` x ``--n`` on the main thread;
* copies: ``--copies`` swap-out + swap-in round trips of ``--mib`` MiB through a CpuDevice whose
  link is fast enough that the memcpy itself is the cost;
* both: the copies queued first, then the same compute, then waiting for the copies.

overlap = (compute + copies - both) / min(compute, copies): 1 when the shorter one is hidden
completely, 0 when they run one after the other.

    python experiments/bench_overlap.py [--rounds 5] [--out results/overlap]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # before NumPy loads BLAS

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import pooch_ext  # noqa: E402,F401
from pooch_ext.hooks.cpu_device import CpuDevice  # noqa: E402
from pooch_ext.links import Link  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "results" / "overlap"


def compute(a: np.ndarray, ops: int) -> float:
    start = time.perf_counter()
    for _ in range(ops):
        a = np.tanh(a @ a * 1e-3)
    return time.perf_counter() - start


def queue_copies(device: CpuDevice, arrays: list[np.ndarray]) -> list:
    transfers = []
    for array in arrays:
        transfer = device.swap_out(array)
        device.swap_in(transfer)
        transfers.append(transfer)
    return transfers


def finish(device: CpuDevice, transfers: list) -> None:
    for transfer in transfers:
        device.wait_swap_in(transfer)
        device.discard(transfer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=384, help="matrix size of a compute op")
    parser.add_argument("--ops", type=int, default=40)
    parser.add_argument("--copies", type=int, default=24)
    parser.add_argument("--mib", type=float, default=16.0)
    parser.add_argument("--out", type=Path, default=OUT,
                        help="output folder (default %(default)s, the committed results)")
    args = parser.parse_args(argv)
    fast = Link("memcpy", 1e15, 1e15, 0.0)       # no emulated limit: the real copy is the cost
    device = CpuDevice(link=fast)
    matrix = np.random.default_rng(0).random((args.n, args.n))
    arrays = [np.ones(int(args.mib * 2**20) // 4, np.float32) for _ in range(args.copies)]
    rows = []
    for round_ in range(args.rounds):
        t_compute = compute(matrix, args.ops)
        start = time.perf_counter()
        finish(device, queue_copies(device, arrays))
        t_copies = time.perf_counter() - start
        start = time.perf_counter()
        transfers = queue_copies(device, arrays)
        compute(matrix, args.ops)
        finish(device, transfers)
        t_both = time.perf_counter() - start
        rows.append(dict(round=round_, compute_s=t_compute, copies_s=t_copies, both_s=t_both))
    device.restore()
    table = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "overlap.csv", index=False)
    c, k, b = (statistics.median(table[col]) for col in ("compute_s", "copies_s", "both_s"))
    overlap = (c + k - b) / min(c, k)
    print(f"compute alone {c * 1e3:.0f} ms, copies alone {k * 1e3:.0f} ms "
          f"({args.copies} round trips of {args.mib:g} MiB), both {b * 1e3:.0f} ms "
          f"(sequential would be {(c + k) * 1e3:.0f} ms); overlap {overlap:.2f} "
          f"(1 = the shorter one fully hidden); {os.cpu_count()} cores, BLAS threads "
          f"{os.environ['OPENBLAS_NUM_THREADS']}; medians of {args.rounds} rounds; "
          f"{args.out / 'overlap.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
