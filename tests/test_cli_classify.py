"""The classify / simulate commands: JSON contract, CSV round trip, one-line budget errors."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pooch_ext.cli import main
from pooch_ext.sim.budgets import budget_between, minimum_budget
from pooch_ext.analytic.synthetic import random_profile
from conftest import saved_profile

FIELDS = {"policy", "link", "budget_bytes", "feasible", "iteration_time_s", "peak_bytes",
          "counts", "classify_seconds"}


@pytest.fixture(scope="module")
def profile_dir(tmp_path_factory):
    profile = random_profile(6, n_layers=9)
    return saved_profile(tmp_path_factory, profile, "cli"), profile


def run_json(capsys, argv):
    code = main(argv + ["--json"])
    return code, json.loads(capsys.readouterr().out)


def test_classify_json_and_simulate_the_written_plan(profile_dir, tmp_path, capsys):
    path, profile = profile_dir
    budget = budget_between(profile, 0.5)
    plan_csv = tmp_path / "plan.csv"
    code, info = run_json(capsys, ["classify", str(path), "--policy", "pooch", "--link", "pcie3",
                                   "--budget", str(budget), "--out", str(plan_csv)])
    assert code == 0 and FIELDS <= set(info)
    assert info["policy"] == "pooch" and info["link"] == "pcie3" and info["feasible"]
    assert info["budget_bytes"] == budget and info["peak_bytes"] <= budget
    assert sum(info["counts"].values()) == len(profile.feature_maps)
    code, again = run_json(capsys, ["simulate", str(path), "--plan", str(plan_csv),
                                    "--link", "pcie3", "--budget", str(budget)])
    assert code == 0 and FIELDS <= set(again)
    assert again["iteration_time_s"] == pytest.approx(info["iteration_time_s"])
    assert again["counts"] == info["counts"] and again["policy"] == "pooch"


def test_units_plot_and_schedule(profile_dir, tmp_path, capsys):
    path, _ = profile_dir
    png, sched = tmp_path / "t.png", tmp_path / "s.csv"
    code = main(["classify", str(path), "--policy", "swap-all", "--budget", "1GiB",
                 "--plot", str(png), "--schedule", str(sched)])
    out = capsys.readouterr().out
    assert code == 0 and "1 GiB" in out and "keep 0" in out
    assert png.read_bytes()[:4] == b"\x89PNG" and sched.read_text().startswith("boundary,order")


def test_infeasible_policy_exits_one_with_the_reason(profile_dir, capsys):
    path, profile = profile_dir
    code, info = run_json(capsys, ["classify", str(path), "--policy", "in-core",
                                   "--budget", str(minimum_budget(profile))])
    assert code == 1 and not info["feasible"] and "keeping every feature map needs" in info["reason"]


def test_budget_below_minimum_is_one_line_without_traceback(profile_dir):
    path, profile = profile_dir
    for command in (["classify", str(path)], ["simulate", str(path), "--plan", "x.csv"]):
        done = subprocess.run([sys.executable, "-m", "pooch_ext.cli", *command, "--budget", "1MB"],
                              capture_output=True, text=True)
        assert done.returncode == 2
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "minimum" in lines[0] and "Traceback" not in done.stderr
        assert str(minimum_budget(profile)) in lines[0]


def test_unknown_policy_and_bad_budget(profile_dir, capsys):
    path, _ = profile_dir
    assert main(["classify", str(path), "--policy", "nope"]) == 2
    assert main(["classify", str(path), "--budget", "lots"]) == 2
    assert main(["classify", str(path), "--budget", "1e400"]) == 2
    err = capsys.readouterr().err
    assert "known: pooch" in err and "not a byte size" in err and "finite number: '1e400'" in err
