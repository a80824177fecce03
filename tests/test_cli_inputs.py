"""What a new user types wrong on the command line gets one line and exit 2, before any work:
output paths, input sizes; and every policy and link name the README offers is accepted."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from pooch_ext.cli import build_parser, main
from pooch_ext.sim.budgets import budget_between
from pooch_ext.analytic.synthetic import random_profile
from conftest import saved_profile

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    profile = random_profile(6, n_layers=6)
    return str(saved_profile(tmp_path_factory, profile, "cli")), budget_between(profile, 0.5)


def exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as done:   # argparse's own errors
        return done.code


def one_line_error(capsys, argv: list[str]) -> str:
    code = exit_code(argv)
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def unwritable_folder(tmp_path: Path) -> Path:
    """A folder this process cannot create files in (root ignores permission bits)."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    for candidate in (folder, Path("/sys"), Path("/proc")):
        try:
            (candidate / "pooch-ext-probe").write_text("")
        except OSError:
            return candidate
        (candidate / "pooch-ext-probe").unlink()
    pytest.skip("no unwritable folder here")


@pytest.mark.parametrize("command, option, target, message", [
    ("classify", "--out", "folder", "is a folder, not a file name"),
    ("classify", "--out", "missing/plan.csv", "folder '{tmp}/missing' does not exist"),
    ("classify", "--schedule", "file/schedule.csv", "folder '{tmp}/file' is a file"),
    ("classify", "--plot", "timeline.svg", "must end in .png"),
    ("simulate", "--plot", "folder/", "is a folder, not a file name"),
    ("profile", "--out", "file", "is a file, not a folder"),
    ("profile", "--out", "file/profile", "cannot create '{tmp}/file/profile'"),
])
def test_output_paths_that_cannot_be_written(saved, tmp_path, capsys, command, option, target,
                                             message):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("a file")
    argv = {"classify": ["classify", saved[0]],
            "simulate": ["simulate", saved[0], "--plan", str(tmp_path / "file")],
            "profile": ["profile", "--model", "small-resnet", "--batch", "2"]}[command]
    err = one_line_error(capsys, argv + [option, str(tmp_path / target)])
    assert f"argument {option}: " in err and message.format(tmp=tmp_path) in err
    assert not (tmp_path / "missing").exists()   # no folder made where the help does not say so


def test_an_empty_output_name_is_called_empty(saved, capsys):
    """A trial: ``--out ''`` said "'' is a folder"."""
    assert "an empty file name" in one_line_error(capsys, ["classify", saved[0], "--out", ""])


def test_unwritable_places(saved, tmp_path, capsys):
    folder = unwritable_folder(tmp_path)
    err = one_line_error(capsys, ["classify", saved[0], "--out", str(folder / "plan.csv")])
    assert f"cannot write '{folder}/plan.csv'" in err
    err = one_line_error(capsys, ["profile", "--model", "small-resnet", "--batch", "2",
                                  "--out", str(folder / "new" / "profile")])
    assert "cannot write" in err


def test_folders_are_made_where_the_help_says_and_files_replaced(saved, tmp_path, capsys):
    help_text = " ".join(build_parser()._subparsers._group_actions[0].choices["profile"]
                         .format_help().split())
    assert "created, with any missing parent folders" in help_text
    deep = tmp_path / "a" / "b" / "profile"
    assert main(["profile", "--model", "small-resnet", "--batch", "2", "--out", str(deep)]) == 0
    assert (deep / "profile.json").is_file()
    plan = tmp_path / "plan.csv"
    plan.write_text("old")
    assert main(["classify", saved[0], "--out", str(plan), "--budget", str(saved[1])]) == 0
    assert plan.read_text().startswith("tensor,")
    capsys.readouterr()


def readme_names(pattern: str) -> list[str]:
    """The `names` in the README passage ``pattern`` matches (its first group)."""
    return re.findall(r"`([a-z0-9-]+)`", re.search(pattern, README, re.S).group(1))


def test_every_policy_and_link_name_the_readme_offers_is_accepted(saved, capsys):
    policies = readme_names(r"`policy` is one of (.*?)\(or your own") + readme_names(r"(`pooch-paper`)")
    links = readme_names(r"for a link \((.*?)\)") + re.findall(r"--link ([a-z0-9-]+)", README)
    assert "pooch-paper" in policies and {"pcie3", "nvlink2", "c2c"} <= set(links)
    for policy in dict.fromkeys(policies):
        assert exit_code(["classify", saved[0], "--policy", policy, "--budget", str(saved[1]),
                          "--json"]) in (0, 1), policy   # 1: the plan does not fit (in-core)
    for link in dict.fromkeys(links):
        assert exit_code(["classify", saved[0], "--policy", "swap-all", "--link", link,
                          "--budget", str(saved[1]), "--json"]) == 0, link
    capsys.readouterr()


@pytest.mark.parametrize("size", ["３x32x32", "3x99999999999999999999x32", "3x2000000x32",
                                  "3 x", "x32x32", "3x32x32x", "3*32*32", "0x32x32"])
def test_malformed_input_sizes(capsys, size):
    err = one_line_error(capsys, ["profile", "--model", "small-resnet", "--batch", "2",
                                  "--input-size", size])
    assert "not a size" in err


def test_demo_out_is_checked_before_training(tmp_path, capsys):
    from pooch_ext.demo import _parse

    (tmp_path / "file").write_text("a file")
    with pytest.raises(SystemExit) as done:
        _parse(["--out", str(tmp_path / "file")])
    assert done.value.code == 2 and "is a file, not a folder" in capsys.readouterr().err
    assert _parse(["--out", str(tmp_path / "new" / "demo")]).out == tmp_path / "new" / "demo"


@pytest.mark.parametrize("argv, says", [
    (["--model", "nope"], "invalid choice: 'nope'"), (["--batch", "0"], "--batch must be"),
    (["--policy", "nope"], "invalid choice"), (["--link", "nope"], "invalid choice"),
    (["--budget-fraction", "nan"], "must lie in (0, 1]"),
    (["--budget-fraction", "-0.5"], "must lie in (0, 1]")])
def test_the_demo_names_a_bad_option_before_anything_is_made(tmp_path, capsys, argv, says):
    """They were tracebacks after the output folder was made (left empty)."""
    from pooch_ext.demo import _parse

    with pytest.raises(SystemExit) as done:
        _parse(argv + ["--out", str(tmp_path / "demo")])
    err = capsys.readouterr().err
    assert done.value.code == 2 and says in err and "Traceback" not in err
    assert not (tmp_path / "demo").exists()


def test_a_negative_size_and_a_folder_that_is_no_profile_are_named(saved, tmp_path, capsys):
    path, _ = saved
    for option in ("--budget", "--host-budget"):      # argparse alone took "-1GiB" for an option
        err = one_line_error(capsys, ["classify", path, option, "-1GiB"])
        # (the same words as the Python API's: it had said "not a byte size" here only)
        assert "must be positive: '-1GiB'" in err or "must be >= 0: '-1GiB'" in err
    err = one_line_error(capsys, ["classify", str(tmp_path), "--budget", "16GiB"])
    assert f"{tmp_path}: not a profile folder (profile.json missing" in err


def test_no_output_replaces_an_input_or_another_output(saved, tmp_path, capsys):
    plan = tmp_path / "plan.csv"
    assert main(["classify", saved[0], "--out", str(plan), "--budget", str(saved[1])]) == 0
    for argv, says in (
            (["classify", saved[0], "--out", f"{saved[0]}/ops.csv"], "would replace an input"),
            (["classify", saved[0], "--schedule", f"{saved[0]}/profile.json"], "would replace"),
            (["simulate", saved[0], "--plan", str(plan), "--schedule", str(plan)], "plan read"),
            (["classify", saved[0], "--out", str(tmp_path / "a.csv"), "--schedule",
              str(tmp_path / "a.csv")], "are the same file")):
        assert says in one_line_error(capsys, argv + ["--budget", str(saved[1])])
    assert Path(saved[0], "ops.csv").stat().st_size and plan.read_text().startswith("tensor")


def test_a_plan_table_with_a_map_twice_is_refused_and_one_left_out_is_counted_kept(
        saved, tmp_path, capsys):
    import json

    import pandas as pd

    plan = tmp_path / "plan.csv"
    assert main(["classify", saved[0], "--out", str(plan), "--budget", str(saved[1])]) == 0
    table = pd.read_csv(plan)
    pd.concat([table, table.iloc[:1]]).to_csv(tmp_path / "twice.csv", index=False)
    assert "has more than one row" in one_line_error(
        capsys, ["simulate", saved[0], "--plan", str(tmp_path / "twice.csv")])
    table.iloc[1:].to_csv(tmp_path / "short.csv", index=False)
    capsys.readouterr()
    assert main(["simulate", saved[0], "--plan", str(tmp_path / "short.csv"), "--json"]) in (0, 1)
    counts = json.loads(capsys.readouterr().out)["counts"]
    assert sum(counts.values()) == len(table)       # the map left out counted, as kept


def test_a_reader_that_stops_early_is_no_error(saved):
    """`pooch-ext classify ... | head -1` exited 2 with 'Broken pipe' although the work was
    done."""
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-m", "pooch_ext.cli", "classify", saved[0]],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()          # gone before anything is printed: the write fails
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0 and b"Traceback" not in err, err


def test_a_budget_above_the_devices_memory_is_said(saved, capsys):
    """Accepted (what if the device were larger?), but a user reading 'feasible yes' at 16
    GiB on a 15.8 GiB V100 profile was not told the plan does not fit that device."""
    from pooch_ext.profile import Profile

    capacity = int(Profile.load(saved[0]).device.capacity_bytes)
    assert main(["classify", saved[0], "--budget", str(capacity + 1)]) in (0, 1)
    assert "is above the memory of the profile's device" in capsys.readouterr().err
    assert main(["classify", saved[0], "--budget", str(saved[1])]) in (0, 1)
    assert "above the memory" not in capsys.readouterr().err


def test_a_cpu_profile_saved_by_pooch_is_not_said_to_be_too_small(tmp_path_factory, capsys):
    """A README walk-through: a profile PoocH saved on the CPU device records the budget it
    ran under as the device's memory, and every larger budget was said not to fit "there",
    though the CPU device has no memory of its own."""
    from pooch_ext.profile import Device

    profile = random_profile(6, n_layers=6)
    profile.device = Device("cpu", budget_between(profile, 0.5), "cpu")
    where = str(saved_profile(tmp_path_factory, profile, "cpu"))
    assert main(["classify", where, "--budget", str(budget_between(profile, 0.9))]) in (0, 1)
    assert "above the memory" not in capsys.readouterr().err


def test_byte_sizes_as_a_user_types_them():
    """A trial: '0.5' said 'must be positive' (it was rounded to 0), a host budget of '0.3'
    became 0 silently, '8PiB' was refused though the stated limit, and the unit list left out
    TB and TiB."""
    from pooch_ext.units import MAX_BYTES, parse_bytes

    for text in ("0.5", "0.3"):
        for zero in (False, True):
            with pytest.raises(ValueError, match="a byte count is a whole number"):
                parse_bytes(text, allow_zero=zero)
    assert parse_bytes("8PiB") == MAX_BYTES and parse_bytes("2TiB") == 2 * 1024**4
    assert parse_bytes("1.5GiB") == 1536 * 1024**2 and parse_bytes("2.0") == 2
    assert parse_bytes(0.4 * 1e9 + 0.3) == 400000000      # a float computed in Python: rounded
    with pytest.raises(ValueError, match="TB, PB, KiB, MiB, GiB, TiB, PiB"):
        parse_bytes("3XB")
    from pooch_ext.units import format_bytes
    assert format_bytes(MAX_BYTES) == "8 PiB"     # (was "8192 TiB", a trial)


def test_a_folder_given_as_the_plan_is_named_a_folder(tmp_path):
    """A trial: ``simulate --plan <a folder>`` said "no such plan file"."""
    from pooch_ext.errors import PoochError
    from pooch_ext.plan import Plan

    with pytest.raises(PoochError, match="a folder, not a plan file"):
        Plan.read_csv(tmp_path)
    with pytest.raises(PoochError, match="no such plan file"):
        Plan.read_csv(tmp_path / "absent.csv")


def test_a_refusal_one_byte_short_shows_the_bytes_that_differ():
    """'budget 4.01 KiB is below the minimum ...: 4.01 KiB (4104 bytes)' said nothing."""
    from pooch_ext.errors import BudgetTooSmallError, HostBudgetTooSmallError

    assert "budget 4.01 KiB (4103 bytes) is below" in str(BudgetTooSmallError(4103, 4104))
    assert "budget 2 GiB is below" in str(BudgetTooSmallError(2 << 30, 5 << 30))
    assert "(1546188225 bytes) is below" in str(
        HostBudgetTooSmallError(1546188225, 1546188226, 1 << 34))


def test_the_demo_says_when_the_chosen_policy_has_no_plan_within_its_budget(tmp_path, capsys):
    """The demo's budget floor is any plan's; sqrt-n's own plan needs more at a fifth of the
    in-core memory: a PolicyDoesNotFitError traceback (a user trial). Now one line that
    names the policy, what it needs and a fraction to try; exit status 2."""
    from pooch_ext.demo import main

    code = main(["--iters", "4", "--profile-iters", "2", "--batch", "8", "--policy", "sqrt-n",
                 "--budget-fraction", "0.2", "--out", str(tmp_path / "demo")])
    err = capsys.readouterr().err
    assert code == 2 and "policy sqrt-n cannot fit" in err and "--budget-fraction" in err
    assert "Traceback" not in err


def test_the_demo_raises_a_fraction_below_any_plans_minimum_and_says_by_how_much(tmp_path,
                                                                                 capsys):
    """A user trial read "just above the smallest budget" and found the budget 18% above it:
    the fallback is FALLBACK_WAY of the way from that minimum to the in-core need, and the
    note now says so with both figures."""
    from pooch_ext.demo import FALLBACK_WAY, _choose_budget, _parse

    args = _parse(["--batch", "8", "--budget-fraction", "0.01", "--out", str(tmp_path / "d")])
    need = _choose_budget(args, False, "CPU device")
    floor, incore = need["minimum_budget_bytes"], need["incore_need_bytes"]
    assert floor < need["budget_bytes"] < incore
    assert need["budget_bytes"] == pytest.approx(floor + FALLBACK_WAY * (incore - floor), abs=1)
    err = capsys.readouterr().err
    assert "below the smallest budget any plan reaches" in err
    assert f"{FALLBACK_WAY:.0%} of the way from there to the in-core need" in err
