"""pooch-ext classify: classify every feature map of a profile with a policy."""
from __future__ import annotations

import argparse

from pooch_ext.commands._paths import FILE_HELP, output_file
from pooch_ext.commands._planning import add_common, add_figures, emit, load, summary, write_outputs
from pooch_ext import encodings
from pooch_ext.policies import POLICY_NAMES, get_policy


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "classify", help="classify feature maps as keep / swap / recompute",
        description="Run a policy on a profile, simulate its plan under the budget, print the "
                    "result and optionally write the classification table (CSV).")
    add_common(parser)
    parser.add_argument("--policy", default="pooch", help=f"one of: {', '.join(POLICY_NAMES)}")
    parser.add_argument("--out", default=None, metavar="CSV", type=output_file,
                        help="write the classification table here (pooch-ext simulate --plan "
                             "reads it); " + FILE_HELP)
    parser.add_argument("--encodings", default="none", choices=encodings.SETTINGS,
                        help="also store maps encoded and run ReLUs in place (Gist): "
                             "lossless (binarize, sparse, in-place ReLUs), lossy (also fp16) "
                             "or lossy-fp8 (also fp8); the fastest set wins, never slower "
                             "than none (default: none)")
    add_figures(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    policy = get_policy(args.policy)
    profile, budget, host_budget = load(args)
    _, plan = encodings.classify(profile, policy.classify, args.encodings, budget=budget,
                                 link=args.link, host_budget=host_budget)
    lines = [f"table            {plan.to_csv(args.out)}"] if args.out else []
    lines += write_outputs(args, plan)
    emit(summary(profile, plan), args.json, lines)
    return 0 if plan.feasible else 1
