"""What PoocH's runtime costs: an all-keep plan vs plain Chainer, and the profiling iterations.

Targets (issue 4): an iteration under PoocH with a plan of all keep costs at most 5% more than
plain Chainer; a profiling iteration (every feature map swapped, everything timed) at most 3x.

Two copies of the same model train on the same batches, interleaved iteration by iteration
(which goes first alternates), so the machine's load drifts over both alike: plain Chainer
(PoocH's hooks taken out of Chainer's hook tables for that step) and the copy under
``PoocH(policy="in-core")``. The
first profiled and the first planned iteration are warm-ups (graph discovery, classification)
and reported apart. Medians of per-iteration times are compared, wall clock and process CPU
time; the CSV keeps every sample. BLAS runs single-threaded unless ``--threads`` says more.

    python experiments/bench_overhead.py [--model small-resnet] [--batch 16] [--iters 40]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "results" / "overhead"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small-resnet")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--iters", type=int, default=40, help="planned iterations to compare")
    parser.add_argument("--profile-iters", type=int, default=3)
    parser.add_argument("--threads", default="1", help="BLAS threads on the CPU")
    parser.add_argument("--gpu", action="store_true", help="run on the current CUDA device")
    parser.add_argument("--out", type=Path, default=OUT)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, args.threads)
    import numpy as np
    import pandas as pd

    import pooch_ext  # noqa: F401
    import chainer
    import chainer.functions as F

    from pooch_ext.hooks.training import make_optimizer, synthetic_batches
    from pooch_ext.models import default_input_size, default_n_classes, get_model
    from pooch_ext.pooch import PoocH

    xp, sync = np, (lambda: None)
    if args.gpu:
        import cupy
        xp, sync = cupy, cupy.cuda.get_current_stream().synchronize

    def setup():
        np.random.seed(0)
        model = get_model(args.model)
        if args.gpu:
            model.to_gpu()
        return model, make_optimizer(model)

    def step(model, optimizer, x, t):
        wall, cpu = time.perf_counter(), time.process_time()
        loss = F.softmax_cross_entropy(model(x), t)
        model.cleargrads()
        loss.backward()
        optimizer.update()
        del loss
        sync()
        return time.perf_counter() - wall, time.process_time() - cpu

    @contextmanager
    def plain_chainer(runtime):
        """PoocH's function and link hooks out of Chainer's tables for one step."""
        functions, links = chainer.get_function_hooks(), chainer._get_link_hooks()
        saved = functions.pop(runtime.name), links.pop(runtime._link_names.name)
        try:
            yield
        finally:
            functions[runtime.name], links[runtime._link_names.name] = saved

    shape, classes = default_input_size(args.model), default_n_classes(args.model)
    total = args.profile_iters + args.iters
    batches = synthetic_batches(total, args.batch, shape, classes, xp=xp)
    plain_model, plain_opt = setup()
    pooch_model, pooch_opt = setup()
    rows = []
    with PoocH(pooch_model, profile_iters=args.profile_iters, policy="in-core",
               verbose=False) as pooch:
        for i, (x, t) in enumerate(batches):
            phase = "profiling" if i < args.profile_iters else "all-keep plan"
            if i in (0, args.profile_iters):
                phase += " (first)"
            for turn in ((0, 1) if i % 2 else (1, 0)):     # who goes first alternates
                if turn == 0:
                    with plain_chainer(pooch.runtime):
                        wall, cpu = step(plain_model, plain_opt, x, t)
                    rows.append(dict(iteration=i, phase="plain", wall_s=wall, cpu_s=cpu))
                else:
                    wall, cpu = step(pooch_model, pooch_opt, x, t)
                    rows.append(dict(iteration=i, phase=phase, wall_s=wall, cpu_s=cpu))
    assert pooch.plan.counts["swap"] == pooch.plan.counts["recompute"] == 0
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "overhead.csv", index=False)

    plain = frame[(frame.phase == "plain") & (frame.iteration > 0)]
    print(f"{args.model}, batch {args.batch}, "
          f"{'GPU' if args.gpu else 'CPU, host-simulated device, BLAS threads ' + args.threads}; "
          f"{args.iters} planned iterations interleaved with plain ones")
    print(f"{'phase':<24}{'n':>4}{'wall ms':>10}{'x plain':>9}{'cpu ms':>10}{'x plain':>9}")
    ratios = {}
    for phase in ["plain", "all-keep plan", "profiling", "profiling (first)",
                  "all-keep plan (first)"]:
        part = plain if phase == "plain" else frame[frame.phase == phase]
        wall, cpu = part.wall_s.median(), part.cpu_s.median()
        ratios[phase] = wall / plain.wall_s.median()
        print(f"{phase:<24}{len(part):>4}{wall * 1e3:>10.2f}{ratios[phase]:>9.3f}"
              f"{cpu * 1e3:>10.2f}{cpu / plain.cpu_s.median():>9.3f}")
    print(f"\nall-keep plan: {100 * (ratios['all-keep plan'] - 1):+.1f}% per iteration "
          f"(target <= +5%); profiling iteration: {ratios['profiling']:.2f}x plain "
          f"(target <= 3x)\nsamples: {args.out / 'overhead.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
