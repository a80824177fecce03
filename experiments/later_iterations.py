"""The smallest budget PoocH accepts on a loop's first iteration, against what its later
iterations need and hold, for the loop styles users write (pooch_ext/loop_styles.py), on the
CPU device.

Per network and loop: ``first``, the smallest budget the check before the first update
accepts (its profile of the first iteration, ``PoocH.checked_profile``, with a roomy budget);
``later``, the smallest budget the later iterations' profile reports; then the loop run at
``max(first, later)``: whether that budget held (overruns; ``held``, the most the device
held in an iteration after the first, and how far the budget sits above it) and training
was bit-identical to plain Chainer. ``named``: the budget a user reaches from ``budget=1`` by
taking each refusal's minimum, and the overruns of the run it accepts.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python experiments/later_iterations.py
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
from tqdm import tqdm

import pooch_ext  # noqa: F401  (chainer import compat)
from pooch_ext.loop_styles import LOOPS, run
from pooch_ext.sim.budgets import minimum_budget
from pooch_ext.testing import states_equal

CASES = [(net, loop) for net in ("pool", "norm") for loop in LOOPS] + \
    [("wide", loop) for loop in ("keeps_loss", "new_batches", "classifier", "drops_loss")] + \
    [("mlp", "accumulates"), ("mlp", "clears_first"), ("input", "keeps_loss"),
     ("input", "new_batches")]
OUT = Path(__file__).resolve().parent.parent / "results" / "later_iterations"


def measure(net: str, loop: str) -> dict:
    """One row: see the module docstring."""
    plain, plain_state, _, _, _ = run(net, loop, None)
    _, _, _, roomy, _ = run(net, loop, dict(profile_iters=3, policy="pooch"))
    first, later = minimum_budget(roomy.checked_profile), minimum_budget(roomy.profile)
    budget = max(first, later)
    values, state, _, pooch, error = run(net, loop, dict(profile_iters=3, budget=budget))
    held = None if error else int(max(h.peak_bytes for h in pooch.runtime.history[1:]))
    named, named_overruns = followed_refusals(net, loop)
    return dict(net=net, loop=loop, first_bytes=first, later_bytes=later,
                first_over_later=first / later - 1, budget_bytes=budget,
                refused=error is not None, overruns=None if error else len(pooch.overruns),
                held_bytes=held, budget_over_held=None if held is None else budget / held - 1,
                identical=None if error else (values == plain and
                                              states_equal(state, plain_state)),
                named_bytes=named, named_overruns=named_overruns)


def followed_refusals(net: str, loop: str, tries: int = 4) -> tuple[int, int]:
    """(the budget a user reaches from ``budget=1`` by taking each refusal's minimum, the
    overruns of the run it accepts): the end of backward refuses first; what runs after
    the first update is refused at the end of that iteration (pooch_ext/refusals.py)."""
    budget = 1
    for _ in range(tries):
        _, _, _, pooch, error = run(net, loop, dict(profile_iters=3, budget=budget))
        if error is None:
            return budget, len(pooch.overruns)
        budget = error.minimum_bytes
    raise RuntimeError(f"{net}/{loop}: still refused after {tries} tries")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, default=OUT)
    args = parser.parse_args(argv)
    rows = [measure(net, loop) for net, loop in tqdm(CASES, desc="loops")]
    table = pd.DataFrame(rows)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out_dir / "later_iterations.csv", index=False)
    shown = table.assign(first_over_later=(100 * table.first_over_later).round(1),
                         budget_over_held=(100 * table.budget_over_held).round(1))
    print(shown[["net", "loop", "first_bytes", "later_bytes", "first_over_later", "refused",
                 "overruns", "held_bytes", "budget_over_held", "identical", "named_bytes",
                 "named_overruns"]].to_string(index=False))
    bad = table[(table.overruns.fillna(0) > 0) | table.refused | (table.identical == False)  # noqa: E712
                | (table.named_overruns > 0)]
    print(f"budget max(first, later): held in {len(table) - len(bad)} of {len(table)} loops; "
          f"first above later by at most {100 * table.first_over_later.max():.1f}%, the "
          f"budget above what was held by at most {100 * table.budget_over_held.max():.1f}%")
    print(args.out_dir / "later_iterations.csv")
    return 1 if len(bad) else 0


if __name__ == "__main__":
    sys.exit(main())
