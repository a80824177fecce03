"""Data-parallel PoocH in simulation (issue 17): ResNet-50 at batch 640 per GPU (about 50 GB
in core) on 16 GB V100s, 1-8 GPUs per node, on the paper's x86 (PCIe gen3) and POWER9
(NVLink 2.0) hosts.

Each GPU runs PoocH's plan for its own batch (analytic profile, the paper's cuDNN
convolutions); after backward the gradients are all-reduced (ChainerMN's optimizer: after the
last backward op, overlapping nothing). Assumptions, stated because the figures follow them:
- the host's bandwidth is shared: on the x86 host GPUs sit two per PCIe switch behind one x16
  uplink (12 GB/s measured per direction), filled one per switch first, so a GPU has 12 GB/s
  up to 4 GPUs and 6 GB/s beyond; on the POWER9 host each GPU has 75 GB/s of NVLink to its
  socket and the two sockets' memory serves at most 2 x 120 GB/s of copies, so a GPU has
  min(75, 240 / GPUs) GB/s. PoocH plans each GPU's swaps at that bandwidth.
- the all-reduce is a ring over the same per-GPU bandwidth (NCCL through the host's links):
  2 (g - 1) / g x the gradient bytes / bandwidth, plus 2 (g - 1) link latencies; its buffers
  (twice the gradient bytes, ChainerMN's pure_nccl packing) are held where backward ends,
  far below the budget here (checked).
Speed-up is images/s over one GPU's; efficiency is the speed-up over the GPU count.

    .venv/bin/python experiments/data_parallel_scaling.py [--gpus 1,2,4,8] [--out-dir ...]

Writes <out>/scaling.csv and <out>/scaling.png.
"""
from __future__ import annotations

import dataclasses
import sys

import pandas as pd
from tqdm import tqdm

import common
from pooch_ext.analytic.tracing import trace_model
from pooch_ext.links import GB, get_link

OUT = common.RESULTS / "data_parallel"
MODEL, BATCH, BUDGET = "resnet50", 640, "16GiB"
HOSTS = {"x86 (pcie3)": "pcie3", "POWER9 (nvlink2)": "nvlink2"}


def per_gpu_bandwidth(host: str, gpus: int) -> float:
    """Bytes/s one GPU gets to the host while all ``gpus`` copy (the assumptions above)."""
    if host == "pcie3":
        return 12 * GB if gpus <= 4 else 6 * GB
    return min(75 * GB, 240 * GB / gpus)


def allreduce_s(grad_bytes: int, gpus: int, bandwidth: float, latency: float) -> float:
    """A ring all-reduce of ``grad_bytes`` over ``gpus`` at ``bandwidth`` per GPU."""
    if gpus == 1:
        return 0.0
    return 2 * (gpus - 1) / gpus * grad_bytes / bandwidth + 2 * (gpus - 1) * latency


def sweep(gpu_counts: list[int]) -> pd.DataFrame:
    p = common.profile(MODEL, BATCH)
    grad_bytes = trace_model(MODEL).param_bytes          # one gradient byte per parameter byte
    rows = []
    plans: dict = {}     # (host, per-GPU bandwidth) -> plan: the link name is only a label
    jobs = [(label, name, g) for label, name in HOSTS.items() for g in gpu_counts]
    for label, name, gpus in tqdm(jobs, desc="data-parallel scaling", unit="case",
                                  leave=False):
        base = get_link(name)
        bandwidth = per_gpu_bandwidth(name, gpus)
        link = dataclasses.replace(base, name=f"{name}/{gpus}gpu", d2h_bytes_per_s=bandwidth,
                                   h2d_bytes_per_s=bandwidth)
        if (name, bandwidth) not in plans:
            plans[name, bandwidth] = common.classify(p, "pooch", link, BUDGET)
        plan = plans[name, bandwidth]
        reduce_s = allreduce_s(grad_bytes, gpus, bandwidth, base.latency_s)
        step = plan.iteration_time_s + reduce_s
        rows.append(dict(host=label, link=name, gpus=gpus, per_gpu_gb_s=bandwidth / GB,
                         feasible=bool(plan.feasible), plan_s=plan.iteration_time_s,
                         allreduce_s=reduce_s, step_s=step,
                         images_per_s=gpus * BATCH / step if plan.feasible else float("nan"),
                         incore_unlimited_images_per_s=gpus * BATCH / p.incore_time_s,
                         allreduce_buffer_bytes=2 * grad_bytes,
                         end_of_backward_bytes=p.resident_bytes + 2 * grad_bytes,
                         **plan.counts))
    table = pd.DataFrame(rows)
    one = table[table.gpus == 1].set_index("host").images_per_s
    table["speedup"] = table.images_per_s / table.host.map(one)
    table["efficiency"] = table.speedup / table.gpus
    return table


def plot(table: pd.DataFrame, path) -> None:
    fig, (speed, parts) = common.plt.subplots(1, 2, figsize=(9, 3.4))
    for host, sel in table.groupby("host", sort=False):
        speed.plot(sel.gpus, sel.images_per_s, "o-", label=f"PoocH, {host}")
        speed.plot(sel.gpus, sel.gpus * sel.images_per_s.iloc[0], ":", color="gray", lw=0.8)
        parts.plot(sel.gpus, sel.plan_s * 1e3, "o-", label=f"plan (fwd+bwd), {host}")
        parts.plot(sel.gpus, sel.allreduce_s * 1e3, "s--", label=f"all-reduce, {host}")
    speed.set(xlabel="GPUs", ylabel="images/s", title=f"ResNet-50 b{BATCH}/GPU, 16 GB each")
    parts.set(xlabel="GPUs", ylabel="ms per step", title="where a step's time goes")
    speed.legend(fontsize=7)
    parts.legend(fontsize=7)
    fig.tight_layout()
    common.save(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__, OUT)
    ap.add_argument("--gpus", type=common.ints, default=list(range(1, 9)),
                    help="GPU counts (default 1..8)")
    args = ap.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    table = sweep(args.gpus)
    common.write_csv(table, args.out_dir / "scaling.csv")
    plot(table, args.out_dir / "scaling.png")
    print(table[["host", "gpus", "per_gpu_gb_s", "plan_s", "allreduce_s", "images_per_s",
                 "speedup", "efficiency", "keep", "swap", "recompute"]]
          .round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(common.cli(main))
