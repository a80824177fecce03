"""Comparison with existing methods (the paper's Figures 17-20): images/s against batch size.

ResNet-50 (batch 64..640) and AlexNet on the simulated 16 GB V100, for in-core, superneurons
and PoocH (plus "pooch-paper", PoocH's two steps without our refinement), on x86 (pcie3) and
POWER9 (nvlink2). In-core is drawn filled where it fits and hollow where it does not: its time
there is the simulated iteration without a memory limit (every op back to back), the ceiling
any out-of-core plan can reach. A method that fails is marked x on the batch axis.

The paper's cross-machine point: the plan PoocH made for nvlink2, run on pcie3. Two readings:
``pooch-nvlink2-schedule`` replays the nvlink2 schedule action for action on the slower link
(replay.py: what our executor does with that plan; its memory is fixed by the op boundaries,
so it fits exactly as on nvlink2 and only the time changes), ``pooch-nvlink2-classes``
re-simulates the nvlink2 classes on pcie3 (the simulator schedules them anew; feasibility
depends only on the classes, so it fits too).

Writes <out>/fig17_20.csv (every run), <out>/fig17_20_summary.csv (the figures the paper
quotes, per network and link), <out>/fig17_18_resnet50.png and <out>/fig19_20_alexnet.png.

    .venv/bin/python experiments/fig17_20_batch_sweep.py [--resnet50 64:641:64] [--alexnet ...]
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd
from tqdm import tqdm

import common
import matplotlib.pyplot as plt
from pooch_ext.plan import Plan
from pooch_ext.sim.engine import simulate_plan
from replay import replay_peak_bytes, replay_time

OUT = common.RESULTS / "fig17_20"
POLICIES = ("in-core", "superneurons", "pooch-paper", "pooch")
CROSS = ("pooch-nvlink2-schedule", "pooch-nvlink2-classes")
FIGURES = {"resnet50": "fig17_18", "alexnet": "fig19_20"}
# the paper's text (sec. 5.2): in-core 316 images/s; PoocH at batch 640 degrades 38% on x86
# and 28% on POWER9 (its largest degradations), i.e. about 196 and 228 images/s
PAPER_INCORE = {"resnet50": 316.0}
PAPER_POOCH_640 = {("resnet50", "pcie3"): 316 * (1 - 0.38),
                   ("resnet50", "nvlink2"): 316 * (1 - 0.28)}


def cross_rows(p, plans: dict, source: str, target: str, budget) -> list[dict]:
    """The plan made for ``source`` run on ``target``: schedule replayed, classes re-simulated."""
    made = plans[source]
    if not made.feasible:
        return []
    t = replay_time(p, made.schedule, target, made.configs)
    replayed = Plan(f"pooch-{source}-schedule", dict(made.classes), feasible=True,
                    iteration_time_s=t,
                    peak_bytes=replay_peak_bytes(p, made.schedule, made.configs))
    resimulated = Plan(f"pooch-{source}-classes", dict(made.classes))
    resimulated = simulate_plan(p, resimulated, target, common.budget_bytes(p, budget))
    return [common.row(p, plan, target, budget, plan_link=source)
            for plan in (replayed, resimulated)]


def sweep(batches: dict[str, list[int]], links, budget=None, gpu: str = common.PAPER_GPU,
          conv: str = common.PAPER_CONV, desc: str = "fig17-20") -> pd.DataFrame:
    """Every policy on every (model, batch, link), plus the cross-machine rows."""
    rows = []
    jobs = [(m, b) for m, bs in batches.items() for b in bs]
    for model, batch in tqdm(jobs, desc=desc, unit="batch", leave=False):
        p = common.profile(model, batch, None, gpu, conv)
        pooch_plans = {}
        for link in links:
            for policy in POLICIES:
                plan, r = common.run(p, policy, link, budget, plan_link=link)
                rows.append(r)
                if policy == "pooch":
                    pooch_plans[link] = plan
        if "nvlink2" in pooch_plans and "pcie3" in pooch_plans:
            rows += cross_rows(p, pooch_plans, "nvlink2", "pcie3", budget)
    return common.with_relative(pd.DataFrame(rows))


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per network and link: what the paper quotes, from our runs."""
    out = []
    for (model, link), sel in table.groupby(["model", "link"], sort=False):
        by = {name: g.set_index("batch") for name, g in sel.groupby("policy")}
        incore, pooch = by["in-core"], by["pooch"]
        fits = incore[incore.feasible]
        over = incore.index[~incore.feasible]
        largest = int(fits.index.max()) if len(fits) else None
        fit_speed = fits.samples_per_s.loc[largest] if largest else math.nan
        ceiling = incore.loc[over].incore_unlimited_samples_per_s
        deg_unlimited = 1 - pooch.loc[over].samples_per_s / ceiling
        deg_paper_steps = 1 - by["pooch-paper"].loc[over].samples_per_s / ceiling
        deg_fit = 1 - pooch.loc[over].samples_per_s / fit_speed
        sn = by["superneurons"]
        paper_range = [b for b in over if 256 <= b <= 512]
        ratio = pooch.loc[over].samples_per_s / sn.loc[over].samples_per_s
        ratio_paper = by["pooch-paper"].loc[over].samples_per_s / sn.loc[over].samples_per_s
        largest_batch = int(pooch.index[pooch.feasible].max())   # the largest PoocH runs
        row = {"model": model, "link": link,
               "incore_largest_fitting_batch": largest, "incore_speed_at_largest_fit": fit_speed,
               "incore_speed_fitting_min": fits.samples_per_s.min() if len(fits) else math.nan,
               "incore_speed_fitting_max": fits.samples_per_s.max() if len(fits) else math.nan,
               "pooch_speed_min": pooch.samples_per_s.min(),
               "pooch_speed_max": pooch.samples_per_s.max(),
               "pooch_degradation_vs_unlimited_min": deg_unlimited.min(),
               "pooch_degradation_vs_unlimited_max": deg_unlimited.max(),
               "pooch-paper_degradation_vs_unlimited_min": deg_paper_steps.min(),
               "pooch-paper_degradation_vs_unlimited_max": deg_paper_steps.max(),
               "pooch_degradation_vs_largest_fit_min": deg_fit.min(),
               "pooch_degradation_vs_largest_fit_max": deg_fit.max(),
               "pooch_over_superneurons_min": ratio.min(),
               "pooch_over_superneurons_max": ratio.max(),
               "pooch_over_superneurons_256_512_min": ratio.loc[paper_range].min(),
               "pooch_over_superneurons_256_512_max": ratio.loc[paper_range].max(),
               "pooch-paper_over_superneurons_256_512_min": ratio_paper.loc[paper_range].min(),
               "pooch-paper_over_superneurons_256_512_max": ratio_paper.loc[paper_range].max(),
               "superneurons_fails_at": " ".join(map(str, sn.index[~sn.feasible])),
               "pooch_fails_at": " ".join(map(str, pooch.index[~pooch.feasible])),
               "largest_batch": largest_batch,
               "incore_unlimited_at_largest_batch":
                   incore.incore_unlimited_samples_per_s.loc[largest_batch]}
        for name in ("pooch", "pooch-paper", "superneurons") + CROSS:
            if name in by and largest_batch in by[name].index:
                r = by[name].loc[largest_batch]
                row[f"{name}_at_largest_batch"] = r.samples_per_s if r.feasible else math.nan
        out.append(row)
    return pd.DataFrame(out)


def plot(table: pd.DataFrame, model: str, path: Path) -> None:
    """Images/s against batch size for ``model``, one panel per link, the paper's marks beside."""
    links = list(dict.fromkeys(table.link))
    fig, axes = plt.subplots(1, len(links), figsize=(5.6 * len(links), 4.4), sharey=True,
                             squeeze=False)
    data = table[table.model == model]
    for ax, link in zip(axes[0], links):
        sel = data[data.link == link]
        common.plot_methods(ax, sel)
        cross = sel[sel.policy == "pooch-nvlink2-schedule"]
        if len(cross):
            common.plot_line(ax, cross, "cross", "PoocH, nvlink2 plan replayed", lw=1)
        if model in PAPER_INCORE:
            ax.axhline(PAPER_INCORE[model], color="gray", lw=0.8, ls="-.",
                       label=f"paper: in-core {PAPER_INCORE[model]:.0f} img/s")
        if (model, link) in PAPER_POOCH_640:
            ax.plot([640], [PAPER_POOCH_640[model, link]], "*", color="purple", ms=12,
                    label="paper: PoocH at 640 (from its degradation)")
        ax.set_title(f"{model} on {common.MACHINE.get(link, link)} ({link})")
        ax.set_xlabel("batch size")
        ax.set_xticks(sorted(sel.batch.unique()))
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(alpha=0.3)
    speeds = data[data.feasible].samples_per_s
    low = 0 if speeds.min() < 0.6 * speeds.max() else 0.9 * speeds.min()
    axes[0][0].set_ylim(bottom=low)
    axes[0][0].set_ylabel("images / s (simulated V100 16 GB)")
    axes[0][0].legend(fontsize=7, loc="lower left")
    common.save(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__, OUT)
    ap.add_argument("--resnet50", type=common.ints, default=list(range(64, 641, 64)),
                    help="ResNet-50 batches: 64,128 or start:stop:step (default 64..640)")
    ap.add_argument("--alexnet", type=common.ints, default=list(range(256, 2561, 256)),
                    help="AlexNet batches (default 256..2560)")
    ap.add_argument("--links", nargs="+", type=common.link_name, default=list(common.PAPER_LINKS))
    args = ap.parse_args(argv)
    table = sweep({"resnet50": args.resnet50, "alexnet": args.alexnet}, args.links, args.budget)
    paths = [common.write_csv(table, args.out_dir / "fig17_20.csv")]
    summ = summary(table)
    paths.append(common.write_csv(summ, args.out_dir / "fig17_20_summary.csv"))
    for model, stem in FIGURES.items():
        path = args.out_dir / f"{stem}_{model}.png"
        plot(table, model, path)
        paths.append(path)
    wide = summ.set_index(["model", "link"]).T
    wide.columns = [f"{m} {link}" for m, link in wide.columns]
    print(common.markdown(wide.map(lambda v: round(v, 3) if isinstance(v, float) else v)
                          .reset_index(names="quantity")))
    common.report(paths)
    return 0


if __name__ == "__main__":
    sys.exit(common.cli(main))
