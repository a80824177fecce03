"""The planner at scale (issue 15): classification time against depth, monotone sweeps, and
pooch's distance to a proven lower bound on real networks.

1. ``depth``: seconds pooch takes (best of ``--repeat``, this machine) against the number of
   ops, on chains whose swaps saturate pcie3 (4 MiB maps, ops of 0.1-0.3 ms: recomputation
   pays and the moves interact, the hardest case for the recompute step), on seeded random
   CNN-like graphs with residual adds (analytic/synthetic.py) and on the paper's networks at
   16 GiB. Chains at 0.3 and random graphs at 0.4 of the way from their minimum budget to
   their in-core need, pcie3. Targets: 2000 layers (about 4000 ops) in <= 5 s, ResNet-50 and
   ResNeXt-101 3D in <= 1 s.
2. ``monotone``: pooch alone per budget and per link against the sweeps of
   policies/sweep.py (each search seeded with its slower neighbour's plan), on budget grids
   (fractions of the in-core need from the minimum budget on; ResNet-50 b512 and
   ResNeXt-101 3D, pcie3 and nvlink2)
   and a bandwidth grid (ResNet-50 at half its in-core need); counts the places where more
   budget or a faster link gave a plan slower by more than 0.1%.
3. ``gap``: ResNet-50 b512 and ResNeXt-101 3D at 0.3-0.9 of their in-core need (from the
   minimum budget on), pcie3 and nvlink2: pooch against the lower bound of
   pooch_ext/milp_bound.py (HiGHS), which no plan can beat, and pooch seeded with the
   bound's own plan (the policy ``pooch-milp``: ``pooch_milp_s``, ``gap_milp``).

4. ``longer`` (reads gap.csv): where pooch is above the bound, pooch with ``--search-factor``
   times its simulations, and the fastest plan any search found, which bounds the optimum
   from above (``longer.csv``).

Writes <out>/depth.csv + depth.png, monotone.csv + monotone.png, gap.csv + gap.png (plan
quality against the bound), longer.csv. The depth part
also runs against an earlier commit's package (``PYTHONPATH=<its checkout>``, ``--label
_before``); depth.png then shows those times too.

    OPENBLAS_NUM_THREADS=1 python experiments/planner_scale.py [--parts depth monotone gap longer]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

import common
import matplotlib.pyplot as plt

OUT = common.RESULTS / "scale"
REAL = (("alexnet", 2048, None), ("vgg16", 256, None), ("resnet50", 512, None),
        ("resnext101-3d", 1, "3x128x448x448"))
CHAIN_MAP_BYTES = 4 << 20


def saturated_chain(layers: int, seed: int = 0):
    """A chain on pcie3 whose swaps take longer than its ops (see the module docstring)."""
    from pooch_ext.analytic.synthetic import chain_profile

    rng = np.random.default_rng(seed)
    return chain_profile(rng.uniform(1e-4, 3e-4, layers).tolist(),
                         nbytes=[CHAIN_MAP_BYTES] * layers, link="pcie3")


def _timed(profile, budget: int, link: str, repeat: int) -> dict:
    from pooch_ext.policies import get_policy
    from pooch_ext.policies.search import SearchStats

    seconds = []
    for _ in range(repeat):
        stats = SearchStats()
        started = time.perf_counter()
        plan = get_policy("pooch").classify(profile, budget, link, stats=stats)
        seconds.append(time.perf_counter() - started)
    return {"seconds": min(seconds), "iteration_time_s": plan.iteration_time_s,
            "relative_to_incore": plan.iteration_time_s / profile.incore_time_s,
            "feasible": plan.feasible, "simulations": stats.simulations,
            "recompute_rounds": stats.recompute_rounds,
            # (absent before the bounds existed: the script also times earlier commits)
            "refine_pruned": getattr(stats, "refine_pruned", 0)}


def _real(names: list[str]) -> list[tuple]:
    return [r for r in REAL if r[0] in names]


def depth(layers: list[int], seeds: int, repeat: int, real: list[tuple],
          conv: str = common.PAPER_CONV) -> pd.DataFrame:
    """Classification seconds of chains, random graphs and the paper's networks (their
    convolutions charged as ``conv``: "im2col", what the executor runs without cuDNN, gives
    them split configurations to choose from)."""
    from pooch_ext.analytic.synthetic import random_profile
    from pooch_ext.sim.budgets import budget_between

    jobs = ([("chain", n, 0) for n in layers]
            + [("random", n, seed) for n in layers for seed in range(seeds)]
            + [("real", model, 0) for model in real])
    rows = []
    for kind, size, seed in tqdm(jobs, desc="depth", unit="net", leave=False):
        if kind == "real":
            model, batch, shape = size
            p = common.profile(model, batch, shape, conv=conv)
            budget, name = int(p.device.capacity_bytes), model + (
                "" if conv == common.PAPER_CONV else f" ({conv})")
        elif kind == "chain":
            p = saturated_chain(size)
            budget, name = budget_between(p, 0.3), f"chain-{size}"
        else:
            p = random_profile(seed, size)
            budget, name = budget_between(p, 0.4), f"random-{size}-{seed}"
        rows.append({"kind": kind, "network": name, "forward_ops": len(p.forward_ops),
                     "ops": p.n_ops, "feature_maps": len(p.feature_maps), "link": "pcie3",
                     "budget_bytes": budget, **_timed(p, budget, "pcie3", repeat)})
    return pd.DataFrame(rows)


def plot_depth(table: pd.DataFrame, path: Path, before: pd.DataFrame | None = None) -> None:
    """Seconds against ops per kind of network; ``before`` (the same table from an earlier
    commit) in faint colours."""
    fig, ax = plt.subplots(figsize=(7.2, 4.6))
    if before is not None:
        for kind, sel in before.groupby("kind"):
            sel = sel.groupby("ops", as_index=False).median(numeric_only=True)
            ax.plot(sel.ops, sel.seconds, color="lightgray", marker=".",
                    ls="none" if kind == "real" else ":",
                    label=f"before: {kind}" if kind != "real" else "before: the paper's networks")
    styles = {"chain": ("tab:red", "o", "--"), "random": ("tab:blue", "s", "--"),
              "real": ("black", "D", "none")}
    real = ", ".join(table[table.kind == "real"].network)
    for kind, (color, marker, line) in styles.items():
        sel = table[table.kind == kind].groupby("ops", as_index=False).median(numeric_only=True)
        if len(sel):
            ax.plot(sel.ops, sel.seconds, color=color, marker=marker, ls=line,
                    label={"chain": "saturated chains", "random": "random CNN-like graphs (median)",
                           "real": f"{real} (16 GiB)"}[kind])
    ax.axhline(5, color="gray", lw=0.8, ls=":")
    ax.axhline(1, color="gray", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ops (forward + backward)")
    ax.set_ylabel("pooch classification seconds")
    ax.set_title("Classification time against depth (pcie3; dotted: 1 s and 5 s)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    common.save(fig, path)


def monotone(fractions: list[float], gbps: list[float], real: list[tuple]) -> pd.DataFrame:
    """pooch alone and the sweeps over the budget grids (each of ``real`` on each link) and
    the bandwidth grid (the first of ``real`` at half its in-core need)."""
    from pooch_ext.links import Link
    from pooch_ext.policies import get_policy
    from pooch_ext.policies.sweep import classify_budgets, classify_links
    from pooch_ext.sim.budgets import budget_between, minimum_budget

    rows = []
    cases = [(model, batch, shape, link) for model, batch, shape in real
             for link in common.PAPER_LINKS]
    for model, batch, shape, link in tqdm(cases, desc="budget grids", leave=False):
        p = common.profile(model, batch, shape)
        grid = _usable(p, model, fractions, "--fractions", quiet=link != common.PAPER_LINKS[0])
        alone = [get_policy("pooch").classify(p, b, link) for _, b in grid]
        swept = classify_budgets(p, [b for _, b in grid], link)
        rows += [{"grid": "budget", "network": model, "link": link, "x": f,
                  "budget_bytes": b, "alone_s": a.iteration_time_s, "sweep_s": s.iteration_time_s}
                 for (f, b), a, s in zip(grid, alone, swept)]
    model, batch, shape = real[0]
    p = common.profile(model, batch, shape)
    budget = int(0.5 * p.incore_peak_bytes)
    if budget < minimum_budget(p):              # (AlexNet: its minimum is above half)
        budget = budget_between(p, 0.5)
    links = [Link(f"{g:g}GB/s", g * 1e9, g * 1e9) for g in gbps]
    alone = [get_policy("pooch").classify(p, budget, link) for link in tqdm(
        links, desc="bandwidth grid", leave=False)]
    swept = classify_links(p, links, budget)
    rows += [{"grid": "bandwidth", "network": model, "link": link.name, "x": g,
              "budget_bytes": budget, "alone_s": a.iteration_time_s, "sweep_s": s.iteration_time_s}
             for g, link, a, s in zip(gbps, links, alone, swept)]
    return pd.DataFrame(rows)


def _usable(p, name: str, fractions: list[float], option: str,
            quiet: bool = False) -> list[tuple[float, int]]:
    """(fraction, budget) of ``fractions`` of ``p``'s in-core need at or above its minimum
    budget; the others are left out, with a note saying so."""
    from pooch_ext.sim.budgets import minimum_budget

    lowest = minimum_budget(p)
    usable = [(f, int(f * p.incore_peak_bytes)) for f in fractions
              if int(f * p.incore_peak_bytes) >= lowest]
    if len(usable) < len(fractions) and not quiet:
        left = sorted(set(fractions) - {f for f, _ in usable})
        tqdm.write(f"note: {option} {', '.join(f'{f:g}' for f in left)} left out for {name}: "
                   f"below its minimum budget, {lowest / p.incore_peak_bytes:.3f} of its "
                   "in-core need", file=sys.stderr)      # (above the progress bar)
    return usable


def violations(table: pd.DataFrame, column: str, tolerance: float = 1e-3) -> pd.DataFrame:
    """Per grid: steps to more budget / a faster link whose plan is slower by > tolerance."""
    out = []
    for (grid, network, link), sel in table.groupby(
            ["grid", "network", table.link.where(table.grid == "budget", "")], sort=False):
        times = sel.sort_values("x")[column].to_numpy()
        worse = times[1:] / times[:-1] - 1
        out.append({"grid": grid, "network": network, "link": link, "steps": len(worse),
                    "violations": int((worse > tolerance).sum()),
                    "worst": float(max(0.0, worse.max())) if len(worse) else 0.0})
    return pd.DataFrame(out)


def plot_monotone(table: pd.DataFrame, path: Path) -> None:
    grids = list(dict.fromkeys(zip(table.grid, table.network,
                                   table.link.where(table.grid == "budget", ""))))
    fig, axes = plt.subplots(1, len(grids), figsize=(3.4 * len(grids), 3.4), squeeze=False)
    for ax, (grid, network, link) in zip(axes[0], grids):
        sel = table[(table.grid == grid) & (table.network == network)]
        if grid == "budget":
            sel = sel[sel.link == link]
        ax.plot(sel.x, sel.alone_s, "o-", ms=3, color="tab:gray", label="pooch alone")
        ax.plot(sel.x, sel.sweep_s, "D-", ms=3, color="tab:blue", label="sweep (seeded)")
        ax.set_title(f"{network} {link or '0.5 in-core'}", fontsize=9)
        ax.set_xlabel("budget / in-core" if grid == "budget" else "GB/s per direction")
        if grid == "bandwidth":
            ax.set_xscale("log", base=2)
            ticks = [g for g in (2, 4, 8, 16, 32, 64) if sel.x.min() <= g <= sel.x.max()]
            ax.set_xticks(ticks, [f"{g:g}" for g in ticks])
            ax.minorticks_off()
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("predicted iteration (s)")
    axes[0][0].legend(fontsize=7)
    common.save(fig, path)


def gap(fractions: list[float], time_limit_s: float, real: list[tuple]) -> pd.DataFrame:
    """pooch against the MILP lower bound, each of ``real`` on each link, at the budgets of
    ``fractions`` of its in-core need that are not below its minimum."""
    from pooch_ext.milp_bound import milp_bound
    from pooch_ext.policies import get_policy
    from pooch_ext.policies.pooch_milp import bound_plan
    from pooch_ext.sim.model import compile_profile

    rows = []
    cases = [(net, link) for net in real for link in common.PAPER_LINKS]
    for (name, batch, shape), link in tqdm(cases, desc="gap", leave=False):
        p = common.profile(name, batch, shape)
        model = compile_profile(p, link)
        quiet = link != common.PAPER_LINKS[0]       # (the note once per network)
        for f, budget in _usable(p, name, fractions, "--gap-fractions", quiet):
            plan = get_policy("pooch").classify(p, budget, link)
            bound = milp_bound(model, budget, time_limit_s)
            # pooch-milp (policies/pooch_milp.py), reusing the bound solved here
            pooch = get_policy("pooch")
            seeded = pooch.faster(pooch.classify(p, budget, link,
                                                 seeds=[bound_plan(model, bound)]), plan)
            rows.append({"network": name, "batch": batch, "link": link, "fraction": f,
                         "budget_bytes": budget, "incore_s": p.incore_time_s,
                         "pooch_s": plan.iteration_time_s, "bound_s": bound.bound_s,
                         "bound_optimal": bound.optimal,
                         "gap": plan.iteration_time_s / bound.bound_s - 1,
                         "bound_plan_s": bound.plan_time_s, "bound_seconds": bound.seconds,
                         "pooch_milp_s": seeded.iteration_time_s,
                         "gap_milp": seeded.iteration_time_s / bound.bound_s - 1})
    return pd.DataFrame(rows)


LONGER_COLUMNS = ["network", "batch", "link", "fraction", "budget_bytes", "pooch_s",
                  "pooch_milp_s", "bound_s", "search_factor", "longer_s", "longer_seconds",
                  "best_known_s", "gap", "gap_to_best_known", "bound_below_best_known"]


def longer(table: pd.DataFrame, factor: float, above: float = 1e-3) -> pd.DataFrame:
    """For each row of ``gap``'s table where pooch is more than ``above`` from the bound:
    pooch with ``factor`` times its refinement's simulations, and the fastest plan any search
    found (pooch, pooch-milp, this longer one). That plan bounds the optimum from above, so
    the optimum lies in [bound_s, best_known_s] and pooch's distance to it in
    [gap_to_best_known, gap]: how much is the search's and how much the bound's."""
    from pooch_ext.policies import get_policy

    rows = []
    todo = table[table["gap"] > above]
    for row in tqdm(list(todo.itertuples()), desc="longer", unit="case", leave=False):
        shape = next(r[2] for r in REAL if r[0] == row.network)
        p = common.profile(row.network, row.batch, shape)
        started = time.perf_counter()
        plan = get_policy("pooch").classify(p, int(row.budget_bytes), row.link,
                                            search_factor=factor)
        seconds = time.perf_counter() - started
        best = min(row.pooch_s, row.pooch_milp_s, plan.iteration_time_s)
        rows.append({"network": row.network, "batch": row.batch, "link": row.link,
                     "fraction": row.fraction, "budget_bytes": row.budget_bytes,
                     "pooch_s": row.pooch_s, "pooch_milp_s": row.pooch_milp_s,
                     "bound_s": row.bound_s, "search_factor": factor,
                     "longer_s": plan.iteration_time_s, "longer_seconds": seconds,
                     "best_known_s": best, "gap": row.gap,
                     "gap_to_best_known": row.pooch_s / best - 1,
                     "bound_below_best_known": best / row.bound_s - 1})
    return pd.DataFrame(rows, columns=LONGER_COLUMNS)


def plot_gap(gap_table: pd.DataFrame, longer_table: pd.DataFrame | None, path: Path) -> None:
    """Plan quality against the bound, one panel per network and link: pooch, pooch-milp and
    the bound as fractions of in-core time; shaded, where the optimum lies (from the bound
    to the fastest plan found, longer.csv's where it belongs to these rows)."""
    best = gap_table[["pooch_s", "pooch_milp_s"]].min(axis=1)
    if longer_table is not None and not longer_table.empty:
        keys = ["network", "link", "fraction"]
        joined = gap_table[keys + ["pooch_s"]].merge(
            longer_table[keys + ["pooch_s", "best_known_s"]], on=keys, how="left",
            suffixes=("", "_longer"))
        same = np.isclose(joined.pooch_s, joined.pooch_s_longer, rtol=1e-12)   # not stale
        best = np.where(same, np.minimum(best, joined.best_known_s), best)
    table = gap_table.assign(best_s=best)
    panels = list(dict.fromkeys(zip(table.network, table.link)))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels), 3.4), squeeze=False)
    for ax, (network, link) in zip(axes[0], panels):
        sel = table[(table.network == network) & (table.link == link)].sort_values("fraction")
        rel = {c: sel[c] / sel.incore_s for c in ("pooch_s", "pooch_milp_s", "bound_s", "best_s")}
        ax.fill_between(sel.fraction, rel["bound_s"], rel["best_s"], color="tab:green",
                        alpha=0.25, lw=0, label="optimum lies here")
        ax.plot(sel.fraction, rel["bound_s"], "-", color="tab:green", label="bound (MILP)")
        ax.plot(sel.fraction, rel["pooch_milp_s"], "s", ms=4, mfc="none", color="tab:orange",
                label="pooch-milp")
        ax.plot(sel.fraction, rel["pooch_s"], "o-", ms=3, color="tab:blue", label="pooch")
        ax.set_title(f"{network} {link}", fontsize=9)
        ax.set_xlabel("budget / in-core")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("predicted iteration / in-core")
    axes[0][0].legend(fontsize=7)
    common.save(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", nargs="+", default=["depth", "monotone", "gap", "longer"],
                    choices=["depth", "monotone", "gap", "longer", "plots"],
                    help="plots: redraw depth.png, monotone.png and gap.png from the CSVs; longer: a "
                    "longer pooch search where gap.csv's gap is above 0.1%% (longer.csv)")
    ap.add_argument("--layers", type=common.ints, default=[50, 125, 250, 500, 1000, 2000])
    ap.add_argument("--real", nargs="+", default=[r[0] for r in REAL],
                    choices=[r[0] for r in REAL], help="the paper's networks to time")
    ap.add_argument("--conv", default=common.PAPER_CONV, choices=["cudnn", "im2col"],
                    help="how the paper's networks' convolutions are charged (depth only; "
                    "im2col: with split configurations, as the executor runs them)")
    ap.add_argument("--grid-networks", nargs="+", default=["resnet50", "resnext101-3d"],
                    choices=[r[0] for r in REAL], help="networks of the budget grids and gaps")
    ap.add_argument("--seeds", type=common.whole(0), default=2, help="random graphs per depth")
    ap.add_argument("--repeat", type=common.whole(1), default=2,
                    help="timed classifications per network")
    ap.add_argument("--fractions", type=common.positive, nargs="+",
                    default=[round(f, 3) for f in np.arange(0.3, 0.951, 0.025)],
                    help="budget grid, fractions of the in-core need")
    ap.add_argument("--gbps", type=common.positive, nargs="+",
                    default=[2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64])
    ap.add_argument("--gap-fractions", type=common.positive, nargs="+",
                    default=[0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
    ap.add_argument("--time-limit", type=common.positive, default=120.0,
                    help="seconds per bound solve")
    ap.add_argument("--search-factor", type=common.positive, default=64.0,
                    help="longer: times pooch's usual refinement simulations")
    ap.add_argument("--out-dir", type=Path, default=OUT)
    ap.add_argument("--label", default="", help="suffix of depth.csv (depth_before.csv: an "
                    "earlier commit's planner, drawn faintly in depth.png)")
    args = ap.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if "depth" in args.parts:
        table = depth(args.layers, args.seeds, args.repeat, _real(args.real), args.conv)
        common.write_csv(table, args.out_dir / f"depth{args.label}.csv")
        print(table[["network", "ops", "seconds", "relative_to_incore"]].to_string(index=False))
    if "plots" in args.parts:
        missing = [name for name in ("depth.csv", "monotone.csv")
                   if not (args.out_dir / name).exists() and name[:-4] not in args.parts]
        if missing:
            print(f"error: --parts plots redraws from {' and '.join(missing)} in "
                  f"{args.out_dir}, which it lacks (run those parts first)", file=sys.stderr)
            return 2
    if ("depth" in args.parts or "plots" in args.parts) and not args.label:
        before = args.out_dir / "depth_before.csv"
        plot_depth(pd.read_csv(args.out_dir / "depth.csv"), args.out_dir / "depth.png",
                   pd.read_csv(before) if before.exists() else None)
    if "monotone" in args.parts:
        table = monotone(args.fractions, args.gbps, _real(args.grid_networks))
        common.write_csv(table, args.out_dir / "monotone.csv")
    if "monotone" in args.parts or "plots" in args.parts:
        table = pd.read_csv(args.out_dir / "monotone.csv")
        plot_monotone(table, args.out_dir / "monotone.png")
        for column in ("alone_s", "sweep_s"):
            print(f"{column}:\n{violations(table, column).to_string(index=False)}")
    if "gap" in args.parts:
        table = gap(args.gap_fractions, args.time_limit, _real(args.grid_networks))
        if table.empty:
            print("error: gap: no --gap-fractions budget is at or above a minimum budget "
                  "(see the notes); gap.csv not written", file=sys.stderr)
            return 2
        common.write_csv(table, args.out_dir / "gap.csv")
        print(table[["network", "link", "fraction", "pooch_s", "bound_s", "gap", "gap_milp",
                     "bound_optimal"]]
              .to_string(index=False))
    if "longer" in args.parts:
        if not (args.out_dir / "gap.csv").exists():
            print(f"error: --parts longer reads gap.csv in {args.out_dir}, which it lacks "
                  "(run --parts gap first)", file=sys.stderr)
            return 2
        table = longer(pd.read_csv(args.out_dir / "gap.csv"), args.search_factor)
        if table.empty:
            print("longer: pooch is within 0.1% of the bound in every row of gap.csv; "
                  "nothing to search longer (longer.csv not written)")
        else:
            common.write_csv(table, args.out_dir / "longer.csv")
            print(table[["network", "link", "fraction", "pooch_s", "longer_s", "best_known_s",
                         "bound_s", "gap_to_best_known", "gap"]].to_string(index=False))
    if {"gap", "longer", "plots"} & set(args.parts) and (args.out_dir / "gap.csv").exists():
        longer_csv = args.out_dir / "longer.csv"
        plot_gap(pd.read_csv(args.out_dir / "gap.csv"),
                 pd.read_csv(longer_csv) if longer_csv.exists() else None,
                 args.out_dir / "gap.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
