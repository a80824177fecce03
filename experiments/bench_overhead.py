"""What PoocH's runtime costs: an all-keep plan vs plain Chainer, and the profiling iterations.

Targets (issue 4): an iteration under PoocH with a plan of all keep costs at most 5% more than
plain Chainer; a profiling iteration (every feature map swapped, everything timed) at most 3x.

Two copies of the same model train on the same batches, interleaved iteration by iteration
(``hooks.training.train_side_by_side``: who goes first alternates), so the machine's load
drifts over both alike: plain Chainer (PoocH's hooks out of Chainer's hook tables for that
step) and the copy under ``PoocH(policy="in-core")``. The first profiled and the first planned
iteration are warm-ups (graph discovery, classification), reported apart. Medians of
per-iteration wall and process CPU times are compared; the CSV keeps every sample. BLAS runs
single-threaded unless ``--threads`` says more (multi-threaded BLAS on a shared machine makes
wall times meaningless).

    python experiments/bench_overhead.py [--model small-resnet] [--batch 16] [--iters 40]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "results" / "overhead"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="small-resnet")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--iters", type=int, default=40, help="planned iterations to compare")
    parser.add_argument("--profile-iters", type=int, default=3)
    parser.add_argument("--threads", default="1", help="BLAS threads on the CPU")
    parser.add_argument("--splits", action="store_true",
                        help="let PoocH split convolutions (off by default: the measured split "
                             "configurations were up to a fifth faster than Chainer's whole im2col "
                             "on this CPU, which hid the runtime's own cost)")
    parser.add_argument("--gpu", action="store_true", help="run on the current CUDA device")
    parser.add_argument("--out", type=Path, default=OUT,
                        help="output folder (default %(default)s, the committed results)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, args.threads)
    import numpy as np
    import pandas as pd

    from pooch_ext.testing import synthetic_batches, train_side_by_side
    from pooch_ext.measure import setup_model
    from pooch_ext.models import default_input_size, default_n_classes

    xp, sync = np, None
    if args.gpu:
        import cupy
        xp, sync = cupy, cupy.cuda.get_current_stream().synchronize
    shape, classes = default_input_size(args.model), default_n_classes(args.model)
    batches = synthetic_batches(args.profile_iters + args.iters, args.batch, shape, classes, xp=xp)
    plain, under = train_side_by_side(
        setup_model(args.model, args.gpu), setup_model(args.model, args.gpu), batches,
        {"profile_iters": args.profile_iters, "policy": "in-core", "verbose": False,
         "split_convolutions": args.splits}, sync=sync)
    if under.error is not None:
        raise under.error
    assert under.pooch.plan.counts["swap"] == under.pooch.plan.counts["recompute"] == 0

    rows = []
    for i in range(len(batches)):
        phase = "profiling" if i < args.profile_iters else "all-keep plan"
        if i in (0, args.profile_iters):
            phase += " (first)"
        rows.append(dict(iteration=i, phase="plain", wall_s=plain.seconds[i],
                         cpu_s=plain.cpu_seconds[i]))
        rows.append(dict(iteration=i, phase=phase, wall_s=under.seconds[i],
                         cpu_s=under.cpu_seconds[i]))
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "overhead.csv", index=False)

    base = frame[(frame.phase == "plain") & (frame.iteration > 0)]
    print(f"{args.model}, batch {args.batch}, "
          f"{'GPU' if args.gpu else 'CPU, CPU device, BLAS threads ' + args.threads}; "
          f"{args.iters} planned iterations interleaved with plain ones")
    print(f"{'phase':<24}{'n':>4}{'wall ms':>10}{'x plain':>9}{'cpu ms':>10}{'x plain':>9}")
    ratios = {}
    for phase in ["plain", "all-keep plan", "profiling", "profiling (first)",
                  "all-keep plan (first)"]:
        part = base if phase == "plain" else frame[frame.phase == phase]
        wall, cpu = part.wall_s.median(), part.cpu_s.median()
        ratios[phase] = wall / base.wall_s.median()
        print(f"{phase:<24}{len(part):>4}{wall * 1e3:>10.2f}{ratios[phase]:>9.3f}"
              f"{cpu * 1e3:>10.2f}{cpu / base.cpu_s.median():>9.3f}")
    first = frame[frame.iteration == 0].set_index("phase").wall_s
    print(f"first iteration (both cold): plain {first['plain'] * 1e3:.1f} ms, profiled "
          f"{first['profiling (first)'] * 1e3:.1f} ms "
          f"({first['profiling (first)'] / first['plain']:.2f}x)")
    print(f"\nall-keep plan: {100 * (ratios['all-keep plan'] - 1):+.1f}% per iteration "
          f"(target <= +5%); profiling iteration: {ratios['profiling']:.2f}x plain "
          f"(target <= 3x)\nsamples: {args.out / 'overhead.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
