"""pooch-ext simulate: predict time and memory of a saved classification."""
from __future__ import annotations

import argparse
import dataclasses
import time

from pooch_ext.encodings import four_class_table, encoded_plan
from pooch_ext.commands._planning import add_common, add_figures, emit, load, summary, write_outputs
from pooch_ext.plan import Plan
from pooch_ext.sim.engine import simulate_plan


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "simulate", help="simulate a classification table on a profile",
        description="Read a plan written by 'pooch-ext classify --out', simulate it on the "
                    "profile under the link and budgets, print the prediction.")
    add_common(parser)
    parser.add_argument("--plan", required=True, metavar="CSV", help="classification table")
    add_figures(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    profile, budget, host_budget = load(args)
    plan = Plan.read_csv(args.plan)
    # maps the table leaves out are kept (sim.model.codes_of): counted so, the counts add up
    kept = {int(t): "keep" for t in profile.feature_maps["tensor"]}
    plan = dataclasses.replace(plan, classes={**kept, **plan.classes})
    started = time.perf_counter()
    target, plan = encoded_plan(profile, plan)
    plan = simulate_plan(target, plan, args.link, budget, host_budget)
    four_class_table(plan, target)
    info = summary(profile, plan)   # classify_seconds: 0, a plan read from a file
    info["simulate_seconds"] = time.perf_counter() - started
    emit(info, args.json, write_outputs(args, plan))
    return 0 if plan.feasible else 1
