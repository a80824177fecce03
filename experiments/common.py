"""What the experiment scripts share: the paper's setup, one policy run as a table row, I/O.

Every experiment classifies analytic profiles (``pooch_ext.analytic.tracing``) with the policies and
reports the simulator's prediction, one row per (problem, link, policy). The paper ran Chainer
+ cuDNN on a 16 GB V100, so its reproduction uses ``gpu="v100-16gb", conv="cudnn"``; the budget
is the device capacity unless a script is told otherwise. "pooch-paper" is PoocH's two steps
alone (``refine=False``); "pooch" adds our local refinement (policies/pooch.py).

Scripts run as ``python experiments/<name>.py`` (this folder is then on sys.path) and import
this module as ``common``; each has ``main(argv) -> int`` so run_all and the tests call them
in-process.
"""
from __future__ import annotations

import argparse
import functools
import math
import sys
from pathlib import Path
from typing import Callable, Iterable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from pooch_ext.analytic.tracing import analytic_profile  # noqa: E402
from pooch_ext.errors import BudgetTooSmallError, PoochError  # noqa: E402
from pooch_ext.links import Link, get_link  # noqa: E402
from pooch_ext.plan import Plan  # noqa: E402
from pooch_ext.policies import get_policy  # noqa: E402
from pooch_ext.policies import sweep  # noqa: E402
from pooch_ext.profile import Profile  # noqa: E402
from pooch_ext.sim.budgets import minimum_budget  # noqa: E402
from pooch_ext.units import parse_bytes  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results"
PAPER_GPU, PAPER_CONV = "v100-16gb", "cudnn"
PAPER_LINKS = ("pcie3", "nvlink2")
MACHINE = {"pcie3": "x86, PCIe gen3", "nvlink2": "POWER9, NVLink 2.0", "pcie4": "PCIe gen4",
           "pcie5": "PCIe gen5", "c2c": "NVLink-C2C"}
# one look per policy across every figure
STYLE = {"in-core": ("black", "o"), "superneurons": ("tab:orange", "s"),
         "pooch": ("tab:blue", "D"), "pooch-paper": ("tab:cyan", "v"),
         "swap-all-nosched": ("tab:gray", "x"), "swap-all": ("tab:olive", "^"),
         "swap-opt": ("tab:green", "P"), "cross": ("tab:red", "*")}
CLASS_COLORS = {"keep": "#4c72b0", "swap": "#dd8452", "recompute": "#55a868"}


@functools.lru_cache(maxsize=128)
def profile(model: str, batch: int, input_size: str | None = None, gpu: str = PAPER_GPU,
            conv: str = PAPER_CONV) -> Profile:
    """The analytic profile (cached: several experiments share problems)."""
    return analytic_profile(model, int(batch), input_size, gpu=gpu, conv=conv)


def budget_bytes(p: Profile, budget: str | int | None) -> int:
    """``budget`` in bytes; None means the device capacity."""
    return int(p.device.capacity_bytes if budget is None else parse_bytes(budget))


def classify(p: Profile, policy: str, link: str | Link, budget: str | int | None = None) -> Plan:
    """The simulated plan of ``policy`` ("pooch-paper": PoocH without our refinement).

    A budget below the minimum any plan reaches gives an infeasible empty plan, not an error:
    sweeps record it as a failure point."""
    try:
        return get_policy(policy).classify(p, budget_bytes(p, budget), get_link(link))
    except BudgetTooSmallError as error:
        return Plan(policy, {}, feasible=False, reason=str(error))


def classify_links(p: Profile, links: list[Link], budget: str | int | None = None) -> list[Plan]:
    """pooch's plans for ``links`` from one sweep (policies/sweep.py: a faster link never gets
    a slower plan); a budget below the minimum gives infeasible empty plans, as ``classify``."""
    try:
        return sweep.classify_links(p, links, budget_bytes(p, budget))
    except BudgetTooSmallError as error:
        return [Plan("pooch", {}, feasible=False, reason=str(error)) for _ in links]


def row(p: Profile, plan: Plan, link: str | Link, budget: str | int | None = None, **extra) -> dict:
    """One CSV row: the problem, the plan's prediction and its class counts.

    ``iteration_time_s`` is what the simulator predicts even for a plan that does not fit (for
    in-core: the time without a memory limit); ``samples_per_s`` is only given where it fits."""
    batch = int(p.meta.get("batch", 1))
    size = p.meta.get("input_size")
    t = plan.iteration_time_s
    out = {"model": p.meta.get("model", ""), "batch": batch,
           "input_size": "x".join(map(str, size)) if size else "", "gpu": p.device.name,
           "conv": p.meta.get("conv", ""), "link": get_link(link).name,
           "budget_bytes": budget_bytes(p, budget),
           "incore_peak_bytes": p.incore_peak_bytes, "minimum_bytes": minimum_budget(p),
           "policy": plan.policy, "feasible": bool(plan.feasible), "iteration_time_s": t,
           "samples_per_s": batch / t if plan.feasible and t and math.isfinite(t) else math.nan,
           "incore_unlimited_samples_per_s": batch / p.incore_time_s,
           "peak_bytes": plan.peak_bytes, **plan.counts,
           "classify_seconds": plan.classify_seconds, "reason": plan.reason}
    out.update(extra)
    return out


def run(p: Profile, policy: str, link: str | Link, budget: str | int | None = None,
        **extra) -> tuple[Plan, dict]:
    """Classify and simulate; the plan and its row."""
    plan = classify(p, policy, link, budget)
    return plan, row(p, plan, link, budget, **extra)


def with_relative(table: pd.DataFrame) -> pd.DataFrame:
    """Add ``relative``: speed over in-core without a memory limit (NaN where a plan fails),
    and ``relative_unlimited`` (1.0, where that in-core point sits on the same scale)."""
    table = table.copy()
    table["relative"] = table.samples_per_s / table.incore_unlimited_samples_per_s
    table["relative_unlimited"] = 1.0
    return table


def by_policy(table: pd.DataFrame, index: list[str], value: str, digits: int = 3) -> pd.DataFrame:
    """One row per problem, one column per policy (in first-seen order), for printing."""
    wide = table.pivot(index=index, columns="policy", values=value)
    return wide[list(dict.fromkeys(table.policy))].round(digits).reset_index()


def parser(doc: str, out: Path) -> argparse.ArgumentParser:
    """The options every experiment takes: where to write and the memory budget."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=out, help=f"output folder (default {out})")
    ap.add_argument("--budget", default=None,
                    help="device memory budget, e.g. 16GB (default: the GPU's capacity)")
    return ap


def case(text: str) -> tuple[str, int]:
    """argparse type: 'model:batch' -> (model, batch)."""
    model, _, batch = text.partition(":")
    return model, ints(batch)[0]


def ints(text: str) -> list[int]:
    """'64,128,256' or '64:641:64' (start:stop:step) -> list of ints."""
    try:
        if ":" in text:
            start, stop, step = (int(v) for v in text.split(":"))
            values = list(range(start, stop, step))
        else:
            values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r} "
                                         "(e.g. 64,128 or 64:641:64)") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"need positive integers: {text!r}")
    return values


def positive(text: str) -> float:
    """argparse type: a finite number above zero (a budget fraction, a bandwidth, seconds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (0 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"need a finite number above zero: {text!r}")
    return value


def whole(least: int) -> Callable[[str], int]:
    """argparse type: a whole number from ``least`` up."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"need {least} or more: {text!r}")
        return value
    return parse


def link_name(text: str) -> str:
    """argparse type: a link preset name (unknown names list the presets)."""
    try:
        return get_link(text).name
    except PoochError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def cli(main: Callable[[list[str] | None], int]) -> int:
    """Run a script's main; a bad input (unknown model, size, budget) is one line, exit 2."""
    try:
        return main(None)
    except (PoochError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def markdown(table: pd.DataFrame) -> str:
    """A pipe table (no tabulate dependency)."""
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)


def write_csv(frame: pd.DataFrame, path: Path) -> Path:
    """Write a non-empty table (an empty one means the experiment did nothing: an error)."""
    if frame.empty:
        raise ValueError(f"{path.name}: no rows to write")
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)
    return path


def plot_line(ax: plt.Axes, sel: pd.DataFrame, style: str, label: str, x: str = "batch",
              y: str = "samples_per_s", **kw) -> None:
    """A policy's feasible runs as a line; its failures as x on the x axis."""
    color, marker = STYLE[style]
    ok = sel[sel.feasible]
    ax.plot(ok[x], ok[y], marker=marker, color=color, label=label, **kw)
    bad = sel[~sel.feasible]
    if len(bad):
        ax.plot(bad[x], [0] * len(bad), "x", color=color, ms=10, mew=2, clip_on=False,
                transform=ax.get_xaxis_transform(), label=f"{label}: fails")


def plot_methods(ax: plt.Axes, sel: pd.DataFrame, x: str = "batch", y: str = "samples_per_s",
                 y_unlimited: str = "incore_unlimited_samples_per_s") -> None:
    """In-core (filled where it fits, hollow at its no-memory-limit speed where it does not),
    superneurons, PoocH's paper steps and PoocH, from the rows of one problem series."""
    color, marker = STYLE["in-core"]
    incore = sel[sel.policy == "in-core"]
    fit, over = incore[incore.feasible], incore[~incore.feasible]
    ax.plot(fit[x], fit[y], marker=marker, color=color, label="in-core")
    ax.plot(over[x], over[y_unlimited], ls=":", marker=marker, mfc="none", color=color,
            label="in-core fails; time without memory limit")
    plot_line(ax, sel[sel.policy == "superneurons"], "superneurons", "superneurons", x, y)
    plot_line(ax, sel[sel.policy == "pooch-paper"], "pooch-paper", "PoocH (paper's steps)", x, y,
              lw=1, ls="--")
    plot_line(ax, sel[sel.policy == "pooch"], "pooch", "PoocH (+ refinement)", x, y)


def save(fig: plt.Figure, path: Path) -> Path:
    """Write ``fig`` to ``path`` (folders made) and close it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report(paths: Iterable[Path]) -> None:
    """Say what a script wrote, one line per file."""
    for path in paths:
        print(f"wrote {path}")
