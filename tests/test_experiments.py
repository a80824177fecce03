"""The experiment scripts on tiny configurations, and the schedule replay they rely on.

Each script's ``main`` runs into a temporary folder; every CSV it writes must have a header
and rows, every PNG must open as an image. The replay timer must give the simulator's own
time on the link a schedule was made for, and never less on a slower link.
"""
from __future__ import annotations

import sys
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
from conftest import cuda_available

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
sys.path.insert(0, str(EXPERIMENTS))

import common  # noqa: E402
import replay  # noqa: E402
from pooch_ext.links import Link  # noqa: E402
from pooch_ext.sim.budgets import budget_between  # noqa: E402


def check_outputs(folder: Path, csvs: list[str], pngs: list[str]) -> dict[str, pd.DataFrame]:
    tables = {}
    for name in csvs:
        table = pd.read_csv(folder / name)
        assert len(table.columns) > 1 and len(table) > 0, name
        tables[name] = table
    for name in pngs:
        image = mpimg.imread(folder / name)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100, name
    return tables


@pytest.mark.slow
def test_resnet50_memory(tmp_path):
    import resnet50_memory as fig

    table = fig.memory_table(batches=[128, 256])
    assert list(table.fits) == [True, False]    # the paper: batch 256 and above do not fit
    fig.plot(table, tmp_path / "memory.png", "v100-16gb")
    check_outputs(tmp_path, [], ["memory.png"])
    lines = common.markdown(table[["batch", "fits"]]).splitlines()
    assert lines == ["| batch | fits |", "|---|---|", "| 128 | True |", "| 256 | False |"]


@pytest.mark.slow
def test_fig15_16(tmp_path):
    import fig15_16_each_optimization as fig

    assert fig.main(["--out-dir", str(tmp_path), "--cases", "alexnet:2432", "--links",
                     "pcie3"]) == 0
    table = check_outputs(tmp_path, ["fig15_16.csv"], ["fig15_16.png"])["fig15_16.csv"]
    speed = table.set_index("policy").speedup
    assert speed["swap-all-nosched"] == pytest.approx(1.0)
    # the paper's ordering: each step is at least as fast as the one before it
    assert speed["swap-all"] >= 1.0 and speed["swap-opt"] >= speed["swap-all"] - 1e-9
    assert speed["pooch"] >= speed["swap-opt"] - 1e-9


@pytest.mark.slow
def test_fig17_20_with_cross_machine_point(tmp_path):
    import fig17_20_batch_sweep as fig

    assert fig.main(["--out-dir", str(tmp_path), "--resnet50", "128,256",
                     "--alexnet", "2432"]) == 0
    tables = check_outputs(tmp_path, ["fig17_20.csv", "fig17_20_summary.csv"],
                           ["fig17_18_resnet50.png", "fig19_20_alexnet.png"])
    table = tables["fig17_20.csv"]
    incore = table[table.policy == "in-core"].set_index(["model", "batch", "link"])
    assert incore.loc[("resnet50", 128, "pcie3"), "feasible"]
    assert not incore.loc[("resnet50", 256, "pcie3"), "feasible"]
    cross = table[table.policy == "pooch-nvlink2-schedule"]
    assert set(cross.link) == {"pcie3"} and set(cross.plan_link) == {"nvlink2"}
    own = table[(table.policy == "pooch") & (table.link == "pcie3")].set_index(["model", "batch"])
    for r in cross.itertuples():   # the pcie3 plan is never slower than the nvlink2 one
        assert own.loc[(r.model, r.batch), "iteration_time_s"] <= r.iteration_time_s + 1e-9


def test_table3(tmp_path):
    import table3_classification as t3

    assert t3.main(["--out-dir", str(tmp_path), "--model", "alexnet", "--batch", "2432"]) == 0
    plans = [f"plan_{p}_{link}.csv" for p in t3.POLICIES for link in common.PAPER_LINKS]
    tables = check_outputs(tmp_path, ["table3.csv", "table3_by_function.csv"] + plans,
                           ["table3.png"])
    counts = tables["table3.csv"]
    assert (counts[["keep", "swap", "recompute"]].sum(axis=1) == 15).all()   # AlexNet's maps
    plan = tables["plan_pooch_pcie3.csv"]
    assert set(plan["class"]) <= {"keep", "swap", "recompute"} and len(plan) == 15


def test_table3_paper_counts_only_where_the_paper_gives_them():
    import table3_classification as t3

    assert t3.paper_counts("resnet50", 512, "pooch", "pcie3") == (66, 12, 27)
    assert t3.paper_counts("resnet50", 512, "pooch-paper", "nvlink2") == (66, 36, 3)
    # a link the paper did not measure has no counts (was a KeyError for pooch-paper)
    assert t3.paper_counts("resnet50", 512, "pooch-paper", "pcie5") is None
    assert t3.paper_counts("alexnet", 512, "pooch", "pcie3") is None


@pytest.mark.slow
def test_fig21_22(tmp_path):
    import fig21_22_resnext3d as fig

    assert fig.main(["--out-dir", str(tmp_path), "--frames", "128", "--sides", "224,480",
                     "--links", "nvlink2"]) == 0
    tables = check_outputs(tmp_path, ["fig21_22.csv", "fig21_22_summary.csv"], ["fig21_22.png"])
    table = tables["fig21_22.csv"]
    big = table[table.input_size == "3x128x480x480"].set_index("policy")
    assert not big.loc["in-core", "feasible"] and big.loc["pooch", "feasible"]
    assert 0 < big.loc["pooch", "relative"] <= 1 + 1e-9


@pytest.mark.slow
def test_beyond_paper(tmp_path):
    import beyond_paper as bp

    assert bp.main(["--out-dir", str(tmp_path), "--batches", "2048", "--sides", "960",
                    "--links", "c2c", "--gbps", "4", "8", "450"]) == 0
    tables = check_outputs(tmp_path, ["hosts.csv", "bandwidth.csv"],
                           ["hosts.png", "bandwidth.png"])
    bw = tables["bandwidth.csv"]
    pooch = bw[bw.policy == "pooch"]
    fractions = pooch[["keep_fraction", "swap_fraction", "recompute_fraction"]].sum(axis=1)
    assert fractions.to_numpy() == pytest.approx(1.0)
    # a faster link never makes PoocH's plan slower (one sweep over the links), nor, here,
    # choose more recomputation
    for _, sel in pooch.groupby("gpu"):
        times = sel.sort_values("gbps").iteration_time_s.to_numpy()
        assert (np.diff(times) <= 0).all()
        slow, fast = sel.sort_values("gbps").iloc[[0, -1]].itertuples()
        assert fast.relative >= slow.relative - 1e-9 and fast.recompute <= slow.recompute


def test_monotone_random_counts_the_steps_that_get_slower(tmp_path, capsys):
    import monotone_random as mr

    assert mr.main(["--out-dir", str(tmp_path), "--layers", "6", "--seeds", "2"]) == 0
    table = check_outputs(tmp_path, ["monotone_random.csv"], [])["monotone_random.csv"]
    assert set(table.kind) == {"link", "budget"} and len(table) == 2 * (16 + 12)
    assert "violations" in capsys.readouterr().out
    steps = pd.DataFrame({"kind": "link", "layers": 6, "seed": 0, "fixed": 0.1,
                          "x": [2.0, 1.0, 4.0, 8.0], "pooch_s": [1.0, 1.0, 1.002, 1.0025]})
    found = mr.violations(steps)          # 1 -> 2 -> 4 GB/s: +0.2%; 4 -> 8: +0.05%, allowed
    assert list(zip(found["from"], found["to"])) == [(2.0, 4.0)]
    assert found.slower.iloc[0] == pytest.approx(0.002)
    assert mr.summary(steps, found).to_dict("records") == [
        {"kind": "link", "grids": 1, "violations": 1, "largest": found.slower.iloc[0]}]
    with pytest.raises(SystemExit):
        mr.main(["--out-dir", str(tmp_path), "--seeds", "0"])


@pytest.mark.slow
def test_planner_scale(tmp_path):
    import planner_scale as ps

    assert ps.main(["--out-dir", str(tmp_path), "--layers", "20,40", "--seeds", "1",
                    "--repeat", "1", "--real", "alexnet", "--grid-networks", "alexnet",
                    "--fractions", "0.8", "0.9", "--gbps", "8", "16",
                    "--gap-fractions", "0.95"]) == 0
    tables = check_outputs(tmp_path, ["depth.csv", "monotone.csv", "gap.csv"],
                           ["depth.png", "monotone.png", "gap.png"])
    depth = tables["depth.csv"]
    assert set(depth.kind) == {"chain", "random", "real"} and depth.feasible.all()
    assert (depth.relative_to_incore >= 1 - 1e-9).all()
    monotone = tables["monotone.csv"]
    assert (ps.violations(monotone, "sweep_s").violations == 0).all()
    gap = tables["gap.csv"]
    assert (gap.pooch_s >= gap.bound_s * (1 - 1e-9)).all() and (gap.bound_s > 0).all()
    assert not (tmp_path / "longer.csv").exists()     # pooch is at the bound here
    # a row above the bound (set so) gets the longer search, never below the bound
    gap.loc[:, "gap"] = 0.05
    gap.to_csv(tmp_path / "gap.csv", index=False)
    assert ps.main(["--parts", "longer", "--out-dir", str(tmp_path),
                    "--search-factor", "3"]) == 0
    longer = pd.read_csv(tmp_path / "longer.csv")
    assert list(longer.columns) == ps.LONGER_COLUMNS and len(longer) == len(gap)
    assert (longer.search_factor == 3).all()
    assert (longer.longer_s >= longer.bound_s * (1 - 1e-9)).all()
    assert np.allclose(longer.best_known_s, longer[["pooch_s", "pooch_milp_s",
                                                    "longer_s"]].min(axis=1))
    (tmp_path / "gap.csv").unlink()
    assert ps.main(["--parts", "longer", "--out-dir", str(tmp_path)]) == 2


def test_bound_diagnose_compares_the_program_with_the_simulator(capsys):
    """The program with a plan's classes fixed is never slower than the plan simulated, and
    its arrivals are compared boundary by boundary; a budget below the minimum is refused."""
    import re

    import bound_diagnose

    for plan in ("pooch", "bound"):
        assert bound_diagnose.main(["--network", "alexnet", "--fraction", "0.85",
                                    "--plan", plan, "--time-limit", "30"]) == 0
        out = capsys.readouterr().out
        simulated, program = map(float, re.search(
            r"simulated ([0-9.]+) ms, the program with its classes ([0-9.]+) ms", out).groups())
        assert 0 < program <= simulated + 0.05 and "forward end" in out
    assert bound_diagnose.main(["--network", "alexnet", "--fraction", "0.01"]) == 2
    assert "below the minimum budget" in capsys.readouterr().err


def test_planner_scale_says_what_it_leaves_out_and_refuses_bad_grids(tmp_path, capsys):
    """A user trial: gap fractions all below the minimum budget ended in a traceback after
    the other parts were written, budget fractions below it were left out unsaid, and a
    zero bandwidth was a traceback. Each is now a note or a one-line error."""
    import planner_scale as ps

    assert ps.main(["--parts", "gap", "--out-dir", str(tmp_path), "--grid-networks",
                    "alexnet", "--gap-fractions", "0.6"]) == 2
    err = capsys.readouterr().err
    assert "--gap-fractions 0.6 left out for alexnet" in err and "gap.csv not written" in err
    assert not (tmp_path / "gap.csv").exists()
    assert ps.main(["--parts", "plots", "--out-dir", str(tmp_path)]) == 2     # no CSVs yet
    assert "run those parts first" in capsys.readouterr().err
    for bad in (["--gbps", "0"], ["--fractions", "-1"], ["--repeat", "0"],
                ["--time-limit", "nan"]):
        with pytest.raises(SystemExit) as exited:
            ps.main(["--parts", "monotone", "--out-dir", str(tmp_path), *bad])
        assert exited.value.code == 2 and "need" in capsys.readouterr().err


def test_planner_scale_times_the_real_networks_with_split_configurations_too(tmp_path):
    """--conv im2col: the profiles the executor runs (convolutions with split
    configurations to choose from), beside the paper's cuDNN ones."""
    import planner_scale as ps

    assert ps.main(["--parts", "depth", "--out-dir", str(tmp_path), "--layers", "20",
                    "--seeds", "0", "--repeat", "1", "--real", "alexnet", "--conv", "im2col",
                    "--label", "_im2col"]) == 0
    depth = pd.read_csv(tmp_path / "depth_im2col.csv")
    assert list(depth.network) == ["chain-20", "alexnet (im2col)"] and depth.feasible.all()


@pytest.mark.slow
def test_run_all_partial(tmp_path):
    import run_all

    assert run_all.main(["--out-dir", str(tmp_path), "--only", "fig15_16", "--quiet"]) == 0
    assert (tmp_path / "fig15_16" / "fig15_16.csv").is_file()
    assert not (tmp_path / "run_all.csv").exists()   # only a full run records its timings


def test_replay_matches_simulator_and_slower_link_is_slower(toy_profile):
    budget = budget_between(toy_profile, 0.3)
    for policy in ("pooch", "swap-opt", "swap-all", "swap-all-nosched"):
        plan = common.classify(toy_profile, policy, "nvlink2", budget)
        assert plan.feasible and len(plan.schedule)
        own = replay.replay_time(toy_profile, plan.schedule, "nvlink2", plan.configs)
        assert own == pytest.approx(plan.iteration_time_s, rel=1e-12)
        assert replay.replay_time(toy_profile, plan.schedule, "pcie3", plan.configs) >= own
        assert replay.replay_peak_bytes(toy_profile, plan.schedule,
                                        plan.configs) == plan.peak_bytes


def test_replay_charges_the_plans_split_convolutions():
    from pooch_ext.analytic.tracing import analytic_profile
    from pooch_ext.sim.budgets import minimum_budget

    profile = analytic_profile("small-resnet", 32, conv="im2col")
    budget = minimum_budget(profile.without_configs()) - 1          # only splits fit
    plan = common.classify(profile, "pooch", "pcie3", budget)
    assert plan.feasible and any(pieces > 1 for pieces in plan.configs.values())
    assert replay.replay_time(profile, plan.schedule, "pcie3", plan.configs) == \
        pytest.approx(plan.iteration_time_s, rel=1e-12)
    assert replay.replay_peak_bytes(profile, plan.schedule, plan.configs) == plan.peak_bytes


def test_replay_rejects_a_broken_schedule(toy_profile):
    plan = common.classify(toy_profile, "swap-all", "pcie3", budget_between(toy_profile, 0.3))
    broken = plan.schedule[plan.schedule.action != "swap_in"]
    with pytest.raises(ValueError, match="not a sound schedule"):
        replay.replay_time(toy_profile, broken, "pcie3")


def test_helpers():
    assert common.ints("64:257:64") == [64, 128, 192, 256]
    assert common.ints("8,16") == [8, 16]
    with pytest.raises(Exception, match="not a list of integers"):
        common.ints("a,b")
    p = common.profile("alexnet", 256)
    plan = common.classify(p, "pooch", "pcie3", budget=1000)   # below any plan's minimum
    assert not plan.feasible and "minimum" in plan.reason
    row = common.row(p, plan, "pcie3", 1000)
    assert row["samples_per_s"] != row["samples_per_s"]   # NaN where the plan fails
    links = [Link(f"{g}GB/s", g * 1e9, g * 1e9) for g in (16, 2, 4)]
    tiny = common.classify_links(p, links, budget=1000)
    assert len(tiny) == 3 and not any(plan.feasible for plan in tiny)
    assert all("minimum" in plan.reason for plan in tiny)


def test_classify_links_gives_the_sweeps_plans_a_faster_link_never_slower(toy_profile):
    """The link grids of the experiments (beyond_paper.py ``bandwidth``) take pooch's plans
    from one sweep: in the links' order, every plan fits and none is slower than the plan
    of a slower link."""
    budget = budget_between(toy_profile, 0.3)
    gbps = (8, 1, 3, 2, 24, 4)
    plans = common.classify_links(toy_profile, [Link(f"{g}GB/s", g * 1e9, g * 1e9)
                                                for g in gbps], budget)
    assert all(plan.feasible and plan.policy == "pooch" for plan in plans)
    by_speed = [plan.iteration_time_s for _, plan in sorted(zip(gbps, plans))]
    assert all(faster <= slower for slower, faster in zip(by_speed, by_speed[1:]))


def test_bad_input_is_one_line(capsys):
    import fig15_16_each_optimization as fig

    assert common.cli(lambda _: fig.main(["--cases", "nonet:64"])) == 2
    message = capsys.readouterr().err.split("\r")[-1].strip()   # after the progress bar
    assert message.startswith("error: unknown model 'nonet'") and "\n" not in message
    with pytest.raises(SystemExit):   # argparse: unknown link presets are named
        fig.main(["--links", "nope"])
    assert "unknown link 'nope'" in capsys.readouterr().err


def test_bench_overlap_writes_its_rounds(tmp_path, capsys):
    import bench_overlap

    assert bench_overlap.main(["--rounds", "2", "--n", "64", "--ops", "3", "--copies", "2",
                               "--mib", "0.5", "--out", str(tmp_path)]) == 0
    table = pd.read_csv(tmp_path / "overlap.csv")
    assert list(table.columns) == ["round", "compute_s", "copies_s", "both_s"]
    assert len(table) == 2 and (table[["compute_s", "copies_s", "both_s"]] > 0).all().all()
    assert "overlap" in capsys.readouterr().out


@pytest.mark.slow
def test_fidelity_quick_compares_predictions_with_measurements(tmp_path, capsys):
    import fidelity

    assert fidelity.main(["--quick", "--iters", "2", "--profile-iters", "2",
                          "--out", str(tmp_path)]) == 0
    frame = pd.read_csv(tmp_path / "fidelity.csv")
    assert len(frame) == 2 and (frame.status == "ok").all()
    assert (frame.measured_s > 0).all() and (frame.predicted_s > 0).all()
    # every run also records pooch's prediction on its own profile: never slower than its plan
    assert (frame.pooch_predicted_s <= frame.predicted_s * (1 + 1e-9)).all()
    assert frame.set_index("policy").pooch_predicted_s["pooch"] == \
        frame.set_index("policy").predicted_s["pooch"]
    assert (frame.measured_peak <= frame.budget_bytes).all()
    assert ((frame.predicted_peak - frame.measured_peak).abs() <= 0.05 * frame.measured_peak).all()
    assert (tmp_path / "fidelity.png").stat().st_size > 0
    assert "measured peak above the budget: 0 of 2 runs" in capsys.readouterr().out
    assert fidelity.main(["--report", "--out", str(tmp_path)]) == 0     # from the CSV alone
    assert "2 cells (2 runs): 2 planned and ran in every run" in capsys.readouterr().out


def test_fidelity_on_the_cupy_device_refuses_in_one_line_without_a_gpu(tmp_path):
    import fidelity

    if cuda_available():
        pytest.skip("CUDA is here: test_fidelity_quick_on_the_gpu runs it")
    with pytest.raises(SystemExit, match="--device cupy needs CuPy and a CUDA GPU"):
        fidelity.main(["--quick", "--device", "cupy", "--out", str(tmp_path)])
    assert not (tmp_path / "fidelity.csv").exists()


@pytest.mark.gpu
def test_fidelity_quick_on_the_gpu(tmp_path, capsys):
    """The same grid on the CuPy device (its own link): predictions beside CUDA-event times
    and the pool's peaks. Not yet run on a GPU (none lent since it was written)."""
    import fidelity

    assert fidelity.main(["--quick", "--device", "cupy", "--iters", "2", "--profile-iters", "2",
                          "--out", str(tmp_path)]) == 0
    frame = pd.read_csv(tmp_path / "fidelity.csv")
    assert len(frame) == 2 and (frame.status == "ok").all() and set(frame.link) == {"native"}
    assert (frame.measured_s > 0).all() and (frame.measured_peak > 0).all()
    assert "measured peak above the budget" in capsys.readouterr().out


def test_fidelity_cells_are_medians_over_their_runs_and_a_failed_run_fails_the_cell():
    import fidelity

    def run(policy, repeat, measured, status="ok"):
        return dict(network="n", link="cpu", policy=policy, fraction=0.5, repeat=repeat,
                    status=status, budget_bytes=100, predicted_s=1.0 + repeat,
                    measured_s=measured, predicted_peak=90, measured_peak=80 + repeat)

    frame = pd.DataFrame([run("pooch", 0, 1.0), run("pooch", 1, 4.0), run("pooch", 2, 2.0),
                          run("sqrt-n", 0, 1.0), run("sqrt-n", 1, 1.0, status="Error: no")])
    cells = fidelity.cells_of(frame)
    assert list(cells.policy) == ["pooch"]
    cell = cells.iloc[0]
    assert (cell.predicted_s, cell.measured_s, cell.measured_peak, cell.runs) == (2.0, 2.0, 81, 3)
    assert cell.spread == pytest.approx(3.0) and cell.time_error == 0


def test_same_results_flags_changed_cells_but_not_wall_clock_seconds(tmp_path):
    import same_results

    new, old = tmp_path / "new", tmp_path / "old"
    for folder in (new, old):
        (folder / "x").mkdir(parents=True)
    pd.DataFrame({"peak": [1, 2], "classify_seconds": [0.1, 0.2]}).to_csv(old / "x/a.csv",
                                                                           index=False)
    pd.DataFrame({"peak": [1, 2], "classify_seconds": [0.3, 0.4]}).to_csv(new / "x/a.csv",
                                                                           index=False)
    assert same_results.differences(new, old) == {}
    pd.DataFrame({"peak": [1, 3], "classify_seconds": [0.3, 0.4]}).to_csv(new / "x/a.csv",
                                                                           index=False)
    pd.DataFrame({"t": [1]}).to_csv(new / "x/b.csv", index=False)
    assert same_results.differences(new, old) == {"x/a.csv": "1 rows differ in peak",
                                                  "x/b.csv": "not in the reference"}


def test_mucudnn_comparison_runs_from_saved_profiles(tmp_path):
    """WD never slower than WR at the same total, undivided only where every whole kernel
    fits, and the table rebuilt from saved profiles alone."""
    import mucudnn_cpu
    from pooch_ext.analytic.tracing import analytic_profile

    profile = analytic_profile("small-resnet", 32, conv="im2col")
    profile.save(tmp_path / "profiles" / "small-resnet_b32")
    assert mucudnn_cpu.main(["--profiles", str(tmp_path / "profiles"), "--cases",
                             "small-resnet:32", "--out-dir", str(tmp_path)]) == 0
    frame = pd.read_csv(tmp_path / "mucudnn.csv")
    assert len(frame) >= 2 and (tmp_path / "mucudnn.png").stat().st_size > 0
    assert (frame.wd_s <= frame.wr_s + 1e-12).all()
    assert frame.undivided_s.isna().iloc[0] and frame.undivided_s.notna().iloc[-1]
    assert frame.wr_s.notna().all() and frame.limit_mib.is_monotonic_increasing


@pytest.mark.slow
def test_data_parallel_scaling(tmp_path):
    import data_parallel_scaling as dp

    assert dp.main(["--out-dir", str(tmp_path), "--gpus", "1,5"]) == 0
    table = check_outputs(tmp_path, ["scaling.csv"], ["scaling.png"])["scaling.csv"]
    assert len(table) == 4 and table.feasible.all()
    one = table[table.gpus == 1]
    assert (one.allreduce_s == 0).all() and (one.speedup == 1).all()
    five = table[table.gpus == 5].set_index("link")
    # the x86 host halves a GPU's bandwidth beyond 4 GPUs; the all-reduce costs time
    assert five.loc["pcie3", "per_gpu_gb_s"] == 6 and (five.allreduce_s > 0).all()
    assert (five.speedup < 5).all() and (five.speedup > 4).all()
    assert (table.end_of_backward_bytes < 16 * 2 ** 30).all()


@pytest.mark.slow
def test_gist_encodings(tmp_path):
    import gist_encodings as gist

    assert gist.main(["--out-dir", str(tmp_path), "--networks", "small-resnet:32",
                      "--pooch", "small-resnet:32", "--fractions", "0", "0.5"]) == 0
    outputs = check_outputs(tmp_path, ["reduction.csv", "pooch.csv"], ["reduction.png"])
    reduction = outputs["reduction.csv"].set_index("setting")
    assert list(reduction.index) == ["lossless", "lossless+dpr", "lossless+dpr8"]
    assert (reduction.reduction > 1).all()
    assert reduction.reduction["lossless+dpr8"] >= reduction.reduction["lossless+dpr"] >= \
        reduction.reduction["lossless"] >= reduction.reduction_without_inplace["lossless"]
    assert (reduction.reduction == (reduction.incore_bytes / reduction.encoded_bytes).round(3)).all()
    table = outputs["pooch.csv"]
    assert table.feasible.all() and len(table) == 2 * 2 * 2   # links x budgets x with/without
    wide = table.pivot_table(index=["link", "budget"], columns="encodings",
                             values=["images_per_s", "minimum_bytes"])
    # never slower, never a larger smallest budget, with encodings
    assert (wide["images_per_s"]["lossless"] >= wide["images_per_s"]["none"]).all()
    assert (wide["minimum_bytes"]["lossless"] <= wide["minimum_bytes"]["none"]).all()


def test_gist_lossy(tmp_path):
    import gist_lossy

    # exit status 0: the lossless run trained bit-identically to plain Chainer
    assert gist_lossy.main(["--out-dir", str(tmp_path), "--iters", "6", "--batch", "4",
                            "--side", "8"]) == 0
    table = check_outputs(tmp_path, ["lossy.csv"], ["lossy.png"])["lossy.csv"]
    assert list(table.columns) == ["iteration", "plain", "lossless", "lossy", "lossy-fp8"]
    assert len(table) == 6 and (table.lossless == table.plain).all()
    # the forward pass is exact under fp16 / fp8 stashes: the first loss, before any update,
    # agrees
    assert table.lossy.iloc[0] == table["lossy-fp8"].iloc[0] == table.plain.iloc[0]
