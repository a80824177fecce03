"""pooch-ext sweep: pooch over several budgets or links, a larger budget or a faster link
never slower (policies/sweep.py), as one table (and a figure)."""
from __future__ import annotations

import argparse
import json

import pandas as pd

from pooch_ext.commands._paths import FILE_HELP, check_distinct, output_file, png_file
from pooch_ext.commands._planning import add_common, note_above_device
from pooch_ext.links import PRESETS
from pooch_ext.plan import Plan
from pooch_ext.policies.sweep import classify_budgets, classify_links
from pooch_ext.profile import Profile
from pooch_ext.sim.budgets import require_host_budget, resolve_budget
from pooch_ext.units import format_bytes

COLUMNS = ("budget_bytes", "link", "feasible", "iteration_time_s", "relative_to_incore",
           "peak_bytes", "host_peak_bytes", "keep", "swap", "recompute", "reason")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "sweep", help="pooch over several budgets or links, monotone by construction",
        description="Classify a profile with pooch at several budgets (--budgets) or on "
                    "several links (--links), each search seeded with the plan of its "
                    "neighbour on the slower side, so more budget or a faster link never "
                    "gets a slower plan (single classify calls can: a local search). Prints "
                    "one row per point; exit 1 if any point has no feasible plan.")
    add_common(parser)
    grid = parser.add_mutually_exclusive_group(required=True)
    grid.add_argument("--budgets", nargs="+", metavar="BUDGET",
                      help="device memory budgets, e.g. 8GiB 10GiB 12GiB (with --link)")
    grid.add_argument("--links", nargs="+", metavar="LINK",
                      help=f"link presets, e.g. pcie3 nvlink2 (with --budget): {', '.join(PRESETS)}")
    parser.add_argument("--out", default=None, metavar="CSV", type=output_file,
                        help="write the table here; " + FILE_HELP)
    parser.add_argument("--plot", default=None, metavar="PNG", type=png_file,
                        help="write iteration time against the budgets or links; " + FILE_HELP)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    check_distinct(args)
    profile = Profile.load(args.profile_dir)
    if args.budgets:
        if args.budget is not None:
            raise ValueError("--budget goes with --links; give the budgets with --budgets")
        budgets = [resolve_budget(profile, b) for b in args.budgets]
        host = require_host_budget(profile, min(budgets), args.host_budget)
        note_above_device(profile, max(budgets))
        plans = classify_budgets(profile, budgets, args.link, host_budget=host, progress=True)
    else:
        if args.link is not None:
            raise ValueError("--link goes with --budgets; give the links with --links")
        budget = resolve_budget(profile, args.budget)
        host = require_host_budget(profile, budget, args.host_budget)
        note_above_device(profile, budget)
        plans = classify_links(profile, args.links, budget, host_budget=host, progress=True)
    table = sweep_table(profile, plans)
    lines = []
    if args.out:
        table.to_csv(args.out, index=False)
        lines.append(f"table            {args.out}")
    if args.plot:
        from pooch_ext.report.sweep import plot_sweep     # matplotlib: only when asked

        figure = plot_sweep(table, profile, args.plot, by_budget=bool(args.budgets))
        lines.append(f"figure           {figure}")
    if args.json:
        print(json.dumps(table.to_dict(orient="records")))
    else:
        print(_text(table))
        for line in lines:
            print(line)
    return 0 if table.feasible.all() else 1


def sweep_table(profile: Profile, plans: list[Plan]) -> pd.DataFrame:
    """One row per plan, in the order asked."""
    return pd.DataFrame([{
        "budget_bytes": int(plan.budget_bytes), "link": plan.link, "feasible": bool(plan.feasible),
        "iteration_time_s": float(plan.iteration_time_s),
        "relative_to_incore": float(plan.iteration_time_s) / profile.incore_time_s,
        "peak_bytes": int(plan.peak_bytes), "host_peak_bytes": int(plan.host_peak_bytes),
        **plan.counts, "reason": plan.reason} for plan in plans], columns=list(COLUMNS))


def _text(table: pd.DataFrame) -> str:
    shown = pd.DataFrame({
        "budget": table.budget_bytes.map(format_bytes), "link": table.link,
        "iteration": [f"{t * 1e3:.2f} ms" if ok else "NO PLAN" for t, ok in
                      zip(table.iteration_time_s, table.feasible)],
        "x in-core": table.relative_to_incore.map(lambda r: f"{r:.3f}"),
        "peak": table.peak_bytes.map(format_bytes),
        "host": table.host_peak_bytes.map(format_bytes),
        "keep/swap/recompute": [f"{k}/{s}/{r}" for k, s, r in
                                zip(table.keep, table.swap, table.recompute)]})
    if shown.budget.duplicated().any() and not table.budget_bytes.duplicated().any():
        shown["budget"] = table.budget_bytes.astype(str) + " B"   # apart by less than shown
    return shown.to_string(index=False)
