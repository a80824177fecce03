"""A value no real iteration has is refused where a profile is made, loaded or compiled, naming
table (or file), row and column; the simulator ends with an error on such values, never spins."""
from __future__ import annotations

import dataclasses
import math
import signal
from contextlib import contextmanager

import numpy as np
import pandas as pd
import pytest

from pooch_ext.errors import ProfileError
from pooch_ext.links import Link
from pooch_ext.plan import Plan
from pooch_ext.policies import get_policy
from pooch_ext.profile import Profile
from pooch_ext.sim.model import SWAP, compile_profile
from pooch_ext.sim.budgets import least_peak
from pooch_ext.sim.engine import run, simulate
from pooch_ext.analytic.synthetic import chain_profile

# (table, row, column, value, what the message says); the toy's rows: tensor 2 is the stem
# conv's output (a feature map of 4x8x8x8 float32), op 3 the first branch conv, which reads 4
BAD = [
    ("tensors", 2, "swap_in_s", math.nan, "nan is not a time in 0..1e+06 s"),
    ("tensors", 2, "swap_out_s", math.inf, "inf is not a time in 0..1e+06 s"),
    ("tensors", 2, "recompute_s", -1e-3, "-0.001 is not a time in 0..1e+06 s"),
    ("ops", 1, "duration_s", -2.0, "-2.0 is not a time in 0..1e+06 s"),
    # beyond it, an iteration's sums lose the other ops' times (1e15 s made another plan)
    ("ops", 1, "duration_s", 1e15, "1000000000000000.0 is not a time in 0..1e+06 s"),
    ("tensors", 2, "bytes", 1, "1 is not shape x dtype size"),
    ("ops", 3, "inputs", [9], "reads tensor 9 before op 7 makes it"),
    ("memory", 3, "bytes", -5, "-5 is not a byte count"),
    ("tensors", 2, "dtype", "float33", "'float33' is not a NumPy dtype"),
    ("ops", 2, "phase", "sideways", "'sideways' is not one of forward, backward, update"),
]


def tables(profile):
    return {name: getattr(profile, name).copy() for name in ("ops", "tensors", "memory")}


def remake(profile, frames):
    return Profile(frames["ops"], frames["tensors"], frames["memory"], profile.resident_bytes,
                   profile.device, profile.link, dict(profile.meta))


def set_cell(frame, row, column, value):
    frame[column] = frame[column].astype(object)
    frame.at[row, column] = value


@contextmanager
def deadline(seconds=10):
    """Fail instead of hanging (the bug this guards against was an endless loop)."""
    def timeout(*_):
        raise TimeoutError(f"still running after {seconds} s")
    old = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("table, row, column, value, what", BAD)
def test_construction_names_table_row_and_column(toy_profile, table, row, column, value, what):
    frames = tables(toy_profile)
    set_cell(frames[table], row, column, value)
    with pytest.raises(ProfileError) as error:
        remake(toy_profile, frames)
    assert f"{table} table, row {row}, column '{column}': {what}" in str(error.value)


@pytest.mark.parametrize("table, row, column, value, what", BAD)
def test_loading_names_file_row_and_column(toy_profile, tmp_path, table, row, column, value, what):
    toy_profile.save(tmp_path)
    path = tmp_path / f"{table}.csv"
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    frame.loc[row, column] = (" ".join(map(str, value)) if isinstance(value, list) else str(value))
    frame.to_csv(path, index=False)
    with pytest.raises(ProfileError) as error:
        Profile.load(tmp_path)
    message = str(error.value)
    assert f"{path}, row {row + 1}, column '{column}': {what}" in message and "\n" not in message


def test_an_edit_in_place_is_refused_before_planning(toy_profile):
    classes = get_policy("swap-all").classify(toy_profile).classes
    toy_profile.tensors.loc[2, "swap_out_s"] = math.nan
    with deadline(), pytest.raises(ProfileError, match="row 2, column 'swap_out_s': nan"):
        get_policy("pooch").classify(toy_profile, toy_profile.incore_peak_bytes // 2)
    with deadline(), pytest.raises(ProfileError, match="swap_out_s"):
        simulate(toy_profile, Plan("swap-all", classes))


@pytest.mark.parametrize("index", [0, 1, 2])
def test_the_simulator_stops_on_a_copy_that_never_ends(index):
    """Past every check (a SimModel changed directly), memory pressure that waits for a copy
    which never completes (a NaN time) ends in an error; it used to loop forever."""
    model = compile_profile(chain_profile([2] * 4, nbytes=12000, link=Link("slow", 4000, 4000, 0)))
    codes = np.full(model.m, SWAP)
    so_s = model.so_s.copy()
    so_s[index] = math.nan
    with deadline(), pytest.raises(ValueError, match="never completes"):
        run(dataclasses.replace(model, so_s=so_s), codes, "early", least_peak(model, codes))


def test_header_values_are_checked(toy_profile, tmp_path):
    with pytest.raises(ProfileError, match="resident_bytes"):
        Profile(toy_profile.ops, toy_profile.tensors, toy_profile.memory, -1,
                toy_profile.device, toy_profile.link)
    with pytest.raises(ValueError, match="finite"):
        dataclasses.replace(toy_profile.link, latency_s=math.inf)
    with pytest.raises(ValueError, match="capacity_bytes"):
        dataclasses.replace(toy_profile.device, capacity_bytes=math.nan)


def test_action_costs_are_checked_and_saved(toy_profile, tmp_path):
    def with_costs(costs):
        return Profile(toy_profile.ops, toy_profile.tensors, toy_profile.memory,
                       toy_profile.resident_bytes, toy_profile.device, toy_profile.link,
                       action_s=costs)

    with pytest.raises(ProfileError, match="'copy' is not a schedule action"):
        with_costs({"copy": 1e-5})
    for bad in (-1e-6, math.nan, math.inf, True, "5"):
        with pytest.raises(ProfileError, match="finite seconds"):
            with_costs({"swap_out": bad})
    profile = with_costs({"swap_out": 6e-5, "free": 4e-6})
    loaded = Profile.load(profile.save(tmp_path / "p"))
    assert loaded == profile and loaded.action_s == {"swap_out": 6e-5, "free": 4e-6}
    assert loaded != toy_profile                       # the costs are part of the profile
    header = tmp_path / "p" / "profile.json"
    header.write_text(header.read_text().replace('"free"', '"fre"'))
    with pytest.raises(ProfileError, match="profile.json.*'fre' is not a schedule action"):
        Profile.load(tmp_path / "p")


def test_an_empty_network_is_refused_in_one_sentence(toy_profile):
    """A profile without ops passed the checks and crashed pooch's search (a division by
    its zero boundaries) with a traceback."""
    empty = {name: frame.iloc[:0] for name, frame in tables(toy_profile).items()}
    with pytest.raises(ProfileError, match="the profile has no ops"):
        Profile(empty["ops"], empty["tensors"], empty["memory"], toy_profile.resident_bytes,
                toy_profile.device, toy_profile.link)


def test_typed_columns_are_taken_as_they_are_and_still_checked(toy_profile):
    """Profile construction takes a frame's number columns that already have their type
    without reading cell by cell (session 22: most of a profile's build time); an integer
    beyond the contract's range in such a column is still named, and a profile remade from
    its own tables is equal to it, cell types included."""
    from pooch_ext.profile_check import MAX_BYTES

    again = remake(toy_profile, tables(toy_profile))
    assert again == toy_profile
    for name in ("ops", "tensors", "memory"):
        assert list(getattr(again, name).dtypes) == list(getattr(toy_profile, name).dtypes)
    frames = tables(toy_profile)
    frames["memory"]["bytes"] = frames["memory"]["bytes"].astype(np.int64)
    frames["memory"].loc[3, "bytes"] = MAX_BYTES + 1
    with pytest.raises(ProfileError) as error:
        remake(toy_profile, frames)
    assert "memory table, row 3, column 'bytes'" in str(error.value)
    assert f"beyond {MAX_BYTES}" in str(error.value)


def test_rows_given_as_dicts_read_a_missing_key_as_a_missing_cell(toy_profile):
    """Rows as dicts (what the builder hands over) are read per column as pd.DataFrame(rows)
    would hold them: a key one row lacks is a missing cell there (optional columns take
    their default), and a required number missing from every row is named."""
    rows = toy_profile.tensors.to_dict("records")
    del rows[1]["held_until"]                    # optional: -1 where missing
    frames = tables(toy_profile)
    frames["tensors"] = rows
    remade = remake(toy_profile, frames)
    assert remade.tensors.held_until.iloc[1] == -1
    for row in rows:
        del row["bytes"]
    with pytest.raises(ProfileError) as error:
        remake(toy_profile, frames)
    assert "column 'bytes'" in str(error.value) and "missing" in str(error.value)


def test_a_profile_is_checked_once_unless_edited_after_it_was_made(monkeypatch):
    """Compiling a profile whose tables are those checked when it was made does not check
    them again; an edit in place (even one that leaves the cells sound) does."""
    from conftest import branchy_builder
    from pooch_ext.sim.model import compile_profile

    profile = branchy_builder().build(update_s=1e-4)
    checks = []
    check = Profile.check
    monkeypatch.setattr(Profile, "check", lambda self: checks.append(1) or check(self))
    compile_profile(profile, "pcie3")
    assert checks == []
    profile.ops.loc[0, "duration_s"] *= 2
    compile_profile(profile, "pcie3")
    assert checks == [1]
