"""pooch-ext profile: make a profile of one training iteration, save it, summarise it.

By default the profile is analytic (the real Chainer graph traced on CPU, charged with the
cost model for a named GPU); ``--measure`` times real training iterations instead
(pooch_ext.measure). Saving and the summary are the same for both.
"""
from __future__ import annotations

import argparse
import json

from pooch_ext.commands._paths import output_folder
from pooch_ext.analytic.costmodel import CONV_IMPLS, GPUS
from pooch_ext.links import PRESETS
from pooch_ext.models import MODEL_NAMES
from pooch_ext.profile import Profile
from pooch_ext.profile_format import format_shape
from pooch_ext.units import UNLIMITED, format_bytes


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "profile", help="profile one training iteration (analytic: no GPU needed)",
        description="Trace the model's real Chainer graph on CPU, charge it with the cost "
                    "model of --gpu, write the profile to --out and print a summary.")
    parser.add_argument("--model", required=True, help=f"one of: {', '.join(MODEL_NAMES)}")
    parser.add_argument("--batch", required=True, type=int, help="mini-batch size (>= 1)")
    parser.add_argument("--input-size", default=None, metavar="SIZE",
                        help="per-sample input, e.g. 3x224x224 or 224x224 (2D), "
                             "3x16x112x112 or 16x112x112 (3D); default: the model's own")
    parser.add_argument("--gpu", default=None,
                        help=f"cost-model GPU: {', '.join(GPUS)} (default v100-16gb)")
    parser.add_argument("--link", default="pcie3", help=f"host link: {', '.join(PRESETS)}")
    parser.add_argument("--conv", default=None, choices=CONV_IMPLS,
                        help="how convolutions are charged: im2col (CuPy without cuDNN, "
                             "default) or cudnn (the paper's setup)")
    parser.add_argument("--out", default=None, metavar="DIR", type=output_folder,
                        help="folder to write the profile into (profile.json + CSVs); created, "
                             "with any missing parent folders, if it does not exist")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.add_argument("--measure", action="store_true",
                        help="measure real training iterations instead: on the CUDA device when "
                             "CuPy sees one (copies timed), else on the CPU device "
                             "(copy times from --link); --gpu and --conv do not apply")
    parser.add_argument("--budget", default=None,
                        help="with --measure: device memory budget while profiling, e.g. 4GiB")
    parser.add_argument("--iters", type=int, default=None,
                        help="with --measure: iterations to profile, the first a warm-up (default 3)")
    parser.set_defaults(run=run)


def _analytic(args: argparse.Namespace) -> Profile:
    from pooch_ext.analytic.tracing import analytic_profile   # imports chainer: only when needed

    given = {k: v for k, v in (("gpu", args.gpu), ("conv", args.conv)) if v is not None}
    return analytic_profile(args.model, args.batch, args.input_size, link=args.link, **given)


def _measured(args: argparse.Namespace) -> Profile:
    from pooch_ext.measure import measured_profile   # imports chainer: only when needed

    return measured_profile(args.model, args.batch, args.input_size, budget=args.budget,
                            iters=3 if args.iters is None else args.iters, link=args.link)


def summary_lines(summary: dict) -> list[str]:
    """The one-screen text form of ``Profile.summary()``."""
    def b(key: str) -> str:
        return f"{format_bytes(summary[key])} ({summary[key]} bytes)"

    # (the CPU device without a budget reports UNLIMITED as its capacity)
    capacity = ("no memory limit" if summary["capacity_bytes"] >= UNLIMITED
                else format_bytes(summary["capacity_bytes"]))

    return [
        f"model            {summary['model']}  batch {summary['batch']}  "
        f"input {summary.get('input_size', '')}  ({summary['source']})",
        f"device           {summary['device']}, {capacity}; link {summary['link']}",
        f"ops              {summary['ops']} ({summary['forward_ops']} forward, "
        f"{summary['backward_ops']} backward"
        + (", the optimizer update" if summary.get("update_ops") else "") + ")",
        f"tensors          {summary['tensors']} ({summary['feature_maps']} feature maps)",
        f"feature maps     {b('feature_map_bytes')}",
        f"resident         {b('resident_bytes')}",
        f"in-core peak     {b('incore_peak_bytes')}"
        + ("  > capacity: needs out-of-core" if summary["incore_peak_bytes"] > summary["capacity_bytes"]
           else ""),
        f"iteration        {summary['iteration_s'] * 1e3:.1f} ms (forward "
        f"{summary['forward_s'] * 1e3:.1f} ms, backward {summary['backward_s'] * 1e3:.1f} ms)"
        + (f"; {summary['batch'] / summary['iteration_s']:.1f} samples/s in-core"
           if summary.get("batch") else ""),
    ]


def run(args: argparse.Namespace) -> int:
    given = [f"--{name}" for name in ("budget", "iters") if getattr(args, name) is not None]
    if given and not args.measure:         # (they had been ignored silently)
        raise ValueError(f"{' and '.join(given)} appl{'y' if len(given) > 1 else 'ies'} "
                         "to --measure only")
    given = [f"--{name}" for name in ("gpu", "conv") if getattr(args, name) is not None]
    if given and args.measure:
        raise ValueError(f"{' and '.join(given)} appl{'y' if len(given) > 1 else 'ies'} to "
                         "the analytic profile only: --measure times the real device")
    profile = _measured(args) if args.measure else _analytic(args)
    summary = profile.summary()
    summary["input_size"] = format_shape(profile.meta.get("input_size", []))
    if args.out:
        summary["out"] = str(profile.save(args.out))
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        print("\n".join(summary_lines(summary)))
        if args.out:
            print(f"written to       {summary['out']}")
    return 0
