"""What ``classify`` and ``simulate`` share: arguments, budget checks, the plan summary and
the files they write."""
from __future__ import annotations

import argparse
import json
import sys

from pooch_ext.commands._paths import FILE_HELP, check_distinct, output_file, png_file
from pooch_ext.links import PRESETS
from pooch_ext.plan import Plan
from pooch_ext.profile import Profile
from pooch_ext.sim.budgets import (minimum_budget, minimum_host_budget, require_budget,
                                   require_host_budget)
from pooch_ext.units import format_bytes


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile_dir", metavar="PROFILE_DIR", help="a folder written by 'pooch-ext profile'")
    parser.add_argument("--link", default=None,
                        help=f"host link preset: {', '.join(PRESETS)} (default: the profile's own "
                             "swap times)")
    parser.add_argument("--budget", default=None,
                        help="device memory budget, e.g. 16GiB, 500MB, 1e9 (default: the "
                             "profile's device capacity)")
    parser.add_argument("--host-budget", default=None,
                        help="host memory the swapped maps may hold at once, e.g. 64GiB, 0 "
                             "(default: unlimited)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def add_figures(parser: argparse.ArgumentParser) -> None:
    """--schedule and --plot, which both commands write."""
    parser.add_argument("--schedule", default=None, metavar="CSV", type=output_file,
                        help="write the schedule of actions the executor replays; " + FILE_HELP)
    parser.add_argument("--plot", default=None, metavar="PNG", type=png_file,
                        help="write the timeline figure (a .png file); " + FILE_HELP)


def load(args: argparse.Namespace) -> tuple[Profile, int, float]:
    """The profile, the budget and the host budget in bytes (math.inf: unlimited); either
    below its minimum raises with it."""
    check_distinct(args)
    profile = Profile.load(args.profile_dir)
    budget = require_budget(profile, args.budget)
    note_above_device(profile, budget)
    return profile, budget, require_host_budget(profile, budget, args.host_budget)


def note_above_device(profile: Profile, budget: int) -> None:
    """A budget above the profile's device memory is allowed (what if the device were
    larger?), but said; not of the CPU device, which has no memory of its own (a profile
    PoocH saved there names the budget it ran under)."""
    capacity = int(profile.device.capacity_bytes)
    if budget > capacity and profile.device.kind != "cpu":
        print(f"pooch-ext: note: the budget, {format_bytes(budget)}, is above the memory of "
              f"the profile's device ({profile.device.name}: {format_bytes(capacity)}); a plan "
              "for it does not fit there", file=sys.stderr)


def summary(profile: Profile, plan: Plan) -> dict:
    """The JSON object both commands print (at least the fields the issue names)."""
    return {
        "policy": plan.policy,
        "link": plan.link,
        "budget_bytes": int(plan.budget_bytes),
        "feasible": bool(plan.feasible),
        "reason": plan.reason,
        "iteration_time_s": float(plan.iteration_time_s),
        "incore_time_s": profile.incore_time_s,
        "peak_bytes": int(plan.peak_bytes),
        "minimum_budget_bytes": int(minimum_budget(profile)),
        "host_peak_bytes": int(plan.host_peak_bytes),
        "host_budget_bytes": plan.host_budget_bytes,      # None: unlimited
        "minimum_host_budget_bytes": None if plan.host_budget_bytes is None else
        int(minimum_host_budget(profile, plan.budget_bytes)),
        "incore_peak_bytes": int(profile.incore_peak_bytes),
        "counts": plan.counts,
        # maps stored encoded, per codec (their forms are counted as keep / swap above)
        "encoded": {codec: list(plan.encodings.values()).count(codec)
                    for codec in sorted(set(plan.encodings.values()))},
        # forward ReLUs that write over their input (Gist's in-place, pooch_ext/inplace.py)
        "inplace": len(plan.inplace),
        "swap_in_timing": plan.swap_in_timing,
        "stall_s": float(plan.timeline.total_stall_s) if plan.timeline is not None else 0.0,
        "classify_seconds": float(plan.classify_seconds),
    }


def write_outputs(args: argparse.Namespace, plan: Plan) -> list[str]:
    """Write the --schedule CSV and the --plot PNG where asked; the lines that name them."""
    lines = []
    if args.schedule:
        plan.schedule.to_csv(args.schedule, index=False)
        lines.append(f"schedule         {args.schedule}")
    if args.plot:
        from pooch_ext.report.timeline import plot_timeline   # matplotlib: only when asked

        lines.append(f"timeline         {plot_timeline(plan.timeline, args.plot)}")
    return lines


def emit(info: dict, as_json: bool, extra_lines: list[str] = ()) -> None:
    """Print the summary: one JSON object, or the text form followed by ``extra_lines``."""
    if as_json:
        print(json.dumps(info, sort_keys=True))
        return
    counts = info["counts"]
    print(f"policy           {info['policy']}  (swap-in {info['swap_in_timing']})")
    print(f"link / budget    {info['link']} / {format_bytes(info['budget_bytes'])} "
          f"(minimum {format_bytes(info['minimum_budget_bytes'])}, in-core peak "
          f"{format_bytes(info['incore_peak_bytes'])})")
    print(f"feasible         {'yes' if info['feasible'] else 'NO: ' + info['reason']}")
    print(f"iteration        {info['iteration_time_s'] * 1e3:.2f} ms  (in-core "
          f"{info['incore_time_s'] * 1e3:.2f} ms, stalls {info['stall_s'] * 1e3:.2f} ms)")
    print(f"peak memory      {format_bytes(info['peak_bytes'])} ({info['peak_bytes']} bytes)")
    print(f"host memory      {format_bytes(info['host_peak_bytes'])} ({info['host_peak_bytes']} "
          f"bytes) swapped at once; {_host_budget_text(info)}")
    encoded = info.get("encoded") or {}
    inplace = info.get("inplace") or 0
    print(f"feature maps     keep {counts['keep']}, swap {counts['swap']}, "
          f"recompute {counts['recompute']}" + (
              " (of these, stored encoded: "
              + ", ".join(f"{n} {codec}" for codec, n in encoded.items()) + ")"
              if encoded else "") + (f"; {inplace} ReLU{'s' if inplace > 1 else ''} in place"
                                     if inplace else ""))
    if "simulate_seconds" in info:      # a plan read from a file: no classification
        print(f"simulated in     {info['simulate_seconds']:.2f} s")
    else:
        print(f"classified in    {info['classify_seconds']:.2f} s")
    for line in extra_lines:
        print(line)


def _host_budget_text(info: dict) -> str:
    if info["host_budget_bytes"] is None:
        return "no host budget"
    return (f"host budget {format_bytes(info['host_budget_bytes'])} (minimum "
            f"{format_bytes(info['minimum_host_budget_bytes'])})")
