"""Targets and figures of the GPU measurements, from the CSVs measure.py wrote.

Kept apart from the measuring so that ``measure.py OUT --report-only`` can rebuild them from
whatever rows exist (run_all.sh does so after a run that hit its time limit).

Targets (issue 6), per model and link; "no data" where the runs they need are missing:
* pooch at the smallest budget (1/3 of the in-core need) at most 30% slower than in-core
  (iteration time; the paper's own measure, throughput lost, is given beside it);
* pooch faster than superneurons and than swap-all at that budget;
* predicted forward + backward time within 10% of the measured one, per run;
* predicted peak within 5% of the pool's measured peak, per run;
* no run whose plan the simulator called feasible ran out of memory;
* parameters after N iterations bit-identical to the plain in-core run's.
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from common import STYLE, save  # noqa: E402

PLAIN = "in-core (plain)"
TARGET_COLUMNS = ("model", "link", "target", "value", "threshold", "passed", "detail")
COLORS = {PLAIN: STYLE["in-core"][0], "swap-all": STYLE["swap-all"][0],
          "superneurons": STYLE["superneurons"][0], "pooch": STYLE["pooch"][0]}


def _ok(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs.status == "ok"]


def _row(model, link, target, value, threshold, passed, detail="") -> dict:
    return dict(model=model, link=link, target=target, value=value, threshold=threshold,
                passed="no data" if passed is None else bool(passed), detail=detail)


def targets(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per target and (model, link); see the module docstring."""
    rows = []
    for (model, link), group in runs.groupby(["model", "link"], sort=False):
        ok = _ok(group)
        mine = _ok(runs[runs.model == model])
        plain = mine[mine.policy == PLAIN]     # in-core moves nothing: any link's run will do
        budgeted = group[group.budget_fraction == group.budget_fraction]
        smallest = budgeted.budget_fraction.min() if len(budgeted) else math.nan
        at_min = ok[np.isclose(ok.budget_fraction, smallest)] if smallest == smallest else ok[:0]
        speed = {p: at_min[at_min.policy == p].measured_s.min() for p in
                 ("pooch", "superneurons", "swap-all")}
        incore_s = plain.measured_s.min() if len(plain) else math.nan
        pooch_s = speed["pooch"]
        fraction = f"{smallest:.3g} of the in-core need" if smallest == smallest else "no budget"
        if pooch_s == pooch_s and incore_s == incore_s:
            slower = pooch_s / incore_s - 1
            ips = at_min[at_min.policy == "pooch"].images_per_s.max()
            lost = 1 - ips / plain.images_per_s.max()
            rows.append(_row(model, link, "pooch at the smallest budget vs in-core: time + x",
                             slower, 0.30, slower <= 0.30,
                             f"{fraction}; throughput lost {lost:.1%} (paper: 38% x86, 28% POWER9)"))
        else:
            rows.append(_row(model, link, "pooch at the smallest budget vs in-core: time + x",
                             math.nan, 0.30, None, f"{fraction}; a run is missing or failed"))
        for rival in ("superneurons", "swap-all"):
            rival_s = speed[rival]
            if pooch_s == pooch_s and rival_s == rival_s:
                rows.append(_row(model, link, f"pooch faster than {rival} (time ratio)",
                                 pooch_s / rival_s, 1.0, pooch_s < rival_s, fraction))
            else:
                rival_rows = at_min[at_min.policy == rival]
                failed = group[(group.policy == rival) & np.isclose(group.budget_fraction, smallest)]
                note = "; ".join(sorted(set(failed.status))) if len(failed) else "not run"
                passed = True if (pooch_s == pooch_s and len(failed)
                                  and not len(rival_rows)) else None
                rows.append(_row(model, link, f"pooch faster than {rival} (time ratio)",
                                 math.nan, 1.0, passed, f"{fraction}; {rival}: {note}"))
        for column, limit, what in (("time_error", 0.10, "predicted time within 10%"),
                                    ("peak_error", 0.05, "predicted peak within 5%")):
            errors = ok[column].dropna()
            worst = errors.abs().max() if len(errors) else math.nan
            within = int((errors.abs() <= limit).sum())
            rows.append(_row(model, link, what + " (worst |error|)", worst, limit,
                             None if not len(errors) else within == len(errors),
                             f"{within} of {len(errors)} runs within"))
        feasible = group[group.plan_feasible == True]   # noqa: E712 (NaN for unplanned rows)
        ooms = int((feasible.status == "oom").sum())
        rows.append(_row(model, link, "feasible plans that ran out of memory", ooms, 0,
                         None if not len(feasible) else ooms == 0,
                         f"of {len(feasible)} runs with a feasible plan"))
        compared = ok[ok.policy != PLAIN].params_identical.dropna()
        same = int((compared == True).sum())   # noqa: E712
        rows.append(_row(model, link, "parameters bit-identical to in-core", same, len(compared),
                         None if not len(compared) else same == len(compared),
                         f"largest |difference| {ok.max_abs_diff.max():.3g}"))
    return pd.DataFrame(rows, columns=list(TARGET_COLUMNS))


# ---------------------------------------------------------------------------------- figures

def _legend(ax, size: int) -> None:
    """A legend where something is labelled (a table of skipped runs draws nothing)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=size, frameon=False)


def plot_throughput(runs: pd.DataFrame, path: Path) -> Path:
    """Images/s per budget and policy, one panel per (model, link); the in-core run as a line."""
    groups = list(runs.groupby(["model", "link"], sort=False))
    fig, axes = plt.subplots(1, max(1, len(groups)), figsize=(5.2 * max(1, len(groups)), 3.8),
                             squeeze=False)
    for ax, ((model, link), group) in zip(axes[0], groups):
        plain = _ok(runs[(runs.model == model) & (runs.policy == PLAIN)])   # any link's
        if len(plain):
            ax.axhline(plain.images_per_s.max(), color=COLORS[PLAIN], ls="--", lw=1,
                       label="in-core (plain Chainer)")
        budgeted = group[group.policy != PLAIN]
        fractions = sorted(budgeted.budget_fraction.dropna().unique(), reverse=True)
        policies = [p for p in ("swap-all", "superneurons", "pooch") if p in set(budgeted.policy)]
        width = 0.8 / max(1, len(policies))
        for k, policy in enumerate(policies):
            for j, fraction in enumerate(fractions):
                cell = budgeted[(budgeted.policy == policy)
                                & np.isclose(budgeted.budget_fraction, fraction)]
                x = j + (k - (len(policies) - 1) / 2) * width
                if len(cell) and cell.status.iloc[0] == "ok":
                    ax.bar(x, cell.images_per_s.iloc[0], width, color=COLORS[policy],
                           label=policy if j == 0 else None)
                elif len(cell):
                    ax.text(x, 0, cell.status.iloc[0], rotation=90, ha="center", va="bottom",
                            fontsize=7, color=COLORS[policy])
        ax.set_xticks(range(len(fractions)), [f"{f:.2g}x" for f in fractions])
        ax.set_xlim(-0.6, max(2, len(fractions)) - 0.4)
        ax.set_xlabel("memory budget (of the in-core need)")
        ax.set_ylabel("images/s")
        batch = int(group.batch.iloc[0])
        ax.set_title(f"{model}, batch {batch}, link {link}", fontsize=9)
        _legend(ax, 7)
    return save(fig, path)


def plot_fidelity(runs: pd.DataFrame, path: Path) -> Path:
    """Predicted vs measured iteration time and peak memory, with the target bands."""
    ok = _ok(runs)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, (pred, meas, band, unit, scale) in zip(axes, (
            ("predicted_s", "measured_s", 0.10, "forward + backward (ms)", 1e3),
            ("predicted_peak_bytes", "measured_peak_bytes", 0.05, "peak memory (MiB)", 2**-20))):
        sel = ok[(ok[pred] > 0) & (ok[meas] > 0)]
        for policy, part in sel.groupby("policy"):
            for link, marker in zip(sorted(set(part.link)), "os^D"):
                cell = part[part.link == link]
                ax.scatter(cell[pred] * scale, cell[meas] * scale, s=28, marker=marker,
                           color=COLORS.get(policy, "gray"), label=f"{policy} ({link})")
        if len(sel):
            lo = min(sel[pred].min(), sel[meas].min()) * scale * 0.8
            hi = max(sel[pred].max(), sel[meas].max()) * scale * 1.25
            line = np.geomspace(lo, hi, 50)
            ax.plot(line, line, color="black", lw=0.8)
            ax.fill_between(line, line * (1 - band), line * (1 + band), color="gray", alpha=0.2,
                            label=f"target: within {band:.0%}")
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_xlabel(f"predicted {unit}")
        ax.set_ylabel(f"measured {unit}")
        _legend(ax, 6)
    fig.suptitle("simulator fidelity: every run that finished", fontsize=10)
    return save(fig, path)


def plot_links(links: pd.DataFrame, path: Path) -> Path:
    """Achieved copy bandwidth against size, native and emulated, with the preset's line."""
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for (link, direction), part in links.groupby(["link", "direction"], sort=False):
        ax.plot(part.bytes / 2**20, part.gbps, marker="o" if direction == "d2h" else "s",
                label=f"{link} {direction}")
    for target, part in links.dropna(subset=["target_gbps"]).groupby("emulates"):
        part = part[part.direction == "d2h"]
        ax.plot(part.bytes / 2**20, part.target_gbps, ls="--", color="black", lw=0.8,
                label=f"{target} preset (latency + bytes / bandwidth)")
    ax.set_xscale("log")
    ax.set_xlabel("copy size (MiB)")
    ax.set_ylabel("achieved GB/s")
    ax.set_title("host <-> device copies through the executor's path", fontsize=9)
    _legend(ax, 7)
    return save(fig, path)


def write_all(out: Path) -> list[Path]:
    """targets.csv and the figures, from runs.csv / link.csv in ``out`` (what exists)."""
    written = []
    runs_path = out / "runs.csv"
    if runs_path.exists():
        runs = pd.read_csv(runs_path)
        table = targets(runs)
        table.to_csv(out / "targets.csv", index=False)
        written += [out / "targets.csv", plot_throughput(runs, out / "throughput.png"),
                    plot_fidelity(runs, out / "fidelity.png")]
        print(table.to_string(index=False, max_colwidth=70))
    links_path = out / "link.csv"
    if links_path.exists():
        written.append(plot_links(pd.read_csv(links_path), out / "link.png"))
    return written
