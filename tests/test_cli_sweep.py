"""pooch-ext sweep: pooch over budgets or links from the command line, a larger budget or a
faster link never slower, as a table, a CSV and a figure; bad grids are one-line errors."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from pooch_ext.analytic.synthetic import random_profile
from pooch_ext.cli import main
from pooch_ext.sim.budgets import budget_between, minimum_budget
from conftest import saved_profile


@pytest.fixture(scope="module")
def profile_dir(tmp_path_factory):
    profile = random_profile(4, n_layers=12)
    return saved_profile(tmp_path_factory, profile, "sweep"), profile


def test_a_budget_sweep_is_monotone_and_writes_its_table_and_figure(profile_dir, tmp_path,
                                                                     capsys):
    path, profile = profile_dir
    budgets = [budget_between(profile, f) for f in (0.6, 0.05, 0.3, 0.9, 0.15)]  # any order
    out, plot = tmp_path / "sweep.csv", tmp_path / "sweep.png"
    assert main(["sweep", str(path), "--budgets", *map(str, budgets), "--link", "pcie3",
                 "--out", str(out), "--plot", str(plot)]) == 0
    printed = capsys.readouterr().out
    assert f"figure           {plot}" in printed and plot.stat().st_size > 0
    table = pd.read_csv(out)
    assert list(table.budget_bytes) == budgets and table.feasible.all()
    assert (table.peak_bytes <= table.budget_bytes).all()
    times = table.sort_values("budget_bytes").iteration_time_s.to_numpy()
    assert (times[1:] <= times[:-1]).all()              # more budget, never slower
    assert (table[["keep", "swap", "recompute"]].sum(axis=1) == len(profile.feature_maps)).all()
    assert main(["sweep", str(path), "--budgets", str(budgets[0]), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 1 and rows[0]["budget_bytes"] == budgets[0]


def test_a_link_sweep_keeps_the_given_order_and_a_faster_link_is_never_slower(profile_dir,
                                                                               capsys):
    path, profile = profile_dir
    assert main(["sweep", str(path), "--links", "nvlink2", "cpu", "pcie3", "--budget",
                 str(budget_between(profile, 0.2)), "--json"]) == 0
    rows = {row["link"]: row["iteration_time_s"] for row in json.loads(capsys.readouterr().out)}
    assert list(rows) == ["nvlink2", "cpu", "pcie3"]
    assert rows["nvlink2"] <= rows["pcie3"] <= rows["cpu"]


@pytest.mark.parametrize("argv,says", [
    (["--budgets", "{low}"], "below the minimum"),
    (["--budgets", "{ok}", "--budget", "{ok}"], "--budget goes with --links"),
    (["--links", "pcie3", "--link", "pcie3"], "--link goes with --budgets"),
    (["--links", "pcie3", "warp"], "unknown link 'warp'"),
    (["--budgets", "abc"], "not a byte size"),
    ([], "one of the arguments --budgets --links is required"),
])
def test_a_bad_sweep_is_one_line_and_exit_2(profile_dir, capsys, argv, says):
    path, profile = profile_dir
    low, ok = minimum_budget(profile) - 1, budget_between(profile, 0.5)
    argv = ["sweep", str(path), *(a.format(low=low, ok=ok) for a in argv)]
    try:
        code = main(argv)
    except SystemExit as exited:        # argparse's own checks
        code = exited.code
    err = capsys.readouterr().err
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err


def test_a_sweep_writes_over_no_input_and_no_other_output(profile_dir, tmp_path, capsys):
    """A trial: ``sweep --out <profile>/ops.csv`` replaced the profile's table (the profile
    no longer loaded) and ``--out x.png --plot x.png`` left only the figure; classify
    refused both. The profile is untouched after the refusal."""
    path, profile = profile_dir
    ops = path / "ops.csv"
    before = ops.read_bytes()
    ok = str(budget_between(profile, 0.5))
    assert main(["sweep", str(path), "--budgets", ok, "--out", str(ops)]) == 2
    assert "would replace an input" in capsys.readouterr().err and ops.read_bytes() == before
    same = str(tmp_path / "same.png")
    assert main(["sweep", str(path), "--budgets", ok, "--out", same, "--plot", same]) == 2
    assert "are the same file" in capsys.readouterr().err
