"""Seeded random damage to a saved profile (bad values, missing columns or files, cut or
repeated rows, broken JSON): loading either fails with one ProfileError line naming the file,
or gives a profile whose PoocH plan is the undamaged one's. Never a hang, never another error."""
from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest

from pooch_ext.errors import ProfileError
from pooch_ext.policies import get_policy
from pooch_ext.profile import Profile
from pooch_ext.profile_format import EXPECTED, HEADER_FILE, TABLES
from pooch_ext.sim.budgets import budget_between
from pooch_ext.analytic.synthetic import random_profile
from test_profile_checks import deadline

CASES = 80
# per cell type, text no real profile holds there (a plausible other value could be a real
# measurement: no check can tell, so the damage here is always impossible)
INVALID = {
    "a number": ["nan", "inf", "-inf", "-1", "-0.5", "", "fast", "1e400"],
    "an integer": ["nan", "1.5", "-7", "", "lots", "1e400", "inf", "99999999999999999999"],
    "true or false": ["maybe", "", "2", "nan"],
    "integers separated by spaces": ["x y", "", "1.5", "-7", "999999"],
    "a shape such as 2x3x4": ["wide", "", "-1", "3x"],
    "text": ["garbage", ""],
}
HEADER_DAMAGE = ["x", -5, None, [], 1.5, math.nan, {}]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    profile = random_profile(6, n_layers=6)
    folder = tmp_path_factory.mktemp("fuzz") / "base"
    profile.save(folder)
    budget = budget_between(profile, 0.5)
    return folder, budget, plan_of(profile, budget)


def plan_of(profile, budget):
    plan = get_policy("pooch").classify(profile, budget)
    return plan.classes, plan.iteration_time_s, plan.peak_bytes


def damage(folder, rng) -> str:
    """Damage the saved profile in ``folder`` one seeded way; says how."""
    table = str(rng.choice(list(TABLES)))
    path = folder / f"{table}.csv"
    how = str(rng.choice(["cell", "cell", "cell", "cell", "column", "cut", "rows", "file", "json"]))
    if how == "cell":
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        column = rng.choice(TABLES[table])
        text = str(rng.choice(INVALID[EXPECTED.get(column.parse, "text")]))
        row = int(rng.integers(len(frame)))
        frame.loc[row, column.name] = text
        frame.to_csv(path, index=False)
        return f"{table}.csv row {row + 1} {column.name} = {text!r}"
    if how == "column":
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        column = str(rng.choice(frame.columns))
        frame.drop(columns=[column]).to_csv(path, index=False)
        return f"{table}.csv without {column}"
    if how == "cut":
        data = path.read_bytes()
        cut = int(rng.integers(len(data)))
        path.write_bytes(data[:cut])
        return f"{table}.csv cut at byte {cut} of {len(data)}"
    if how == "rows":
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        row = int(rng.integers(len(frame)))
        changed = frame.drop(index=row) if rng.random() < 0.5 else pd.concat([frame, frame.iloc[[row]]])
        changed.to_csv(path, index=False)
        return f"{table}.csv with row {row + 1} dropped or repeated"
    if how == "file":
        victim = folder / str(rng.choice([HEADER_FILE] + [f"{t}.csv" for t in TABLES]))
        victim.unlink()
        return f"{victim.name} deleted"
    header_path = folder / HEADER_FILE
    header = json.loads(header_path.read_text())
    kind = str(rng.choice(["cut", "field", "nested", "drop"]))
    if kind == "cut":
        text = header_path.read_text()
        header_path.write_text(text[: int(rng.integers(len(text) - 1))])
        return "profile.json cut"
    bad = HEADER_DAMAGE[int(rng.integers(len(HEADER_DAMAGE)))]
    if kind == "field":
        key = str(rng.choice(sorted(header)))
        header[key] = bad
    elif kind == "nested":
        key, inner = [("device", "capacity_bytes"), ("device", "name"), ("link", "latency_s"),
                      ("link", "d2h_bytes_per_s"), ("rows", table)][int(rng.integers(5))]
        header[key][inner] = bad
        key = f"{key}.{inner}"
    else:
        key = str(rng.choice(sorted(header)))
        del header[key]
        bad = "(deleted)"
    header_path.write_text(json.dumps(header))
    return f"profile.json {key} = {bad!r}"


@pytest.mark.parametrize("case", range(CASES))
def test_damaged_profile_fails_clearly_or_plans_the_same(base, tmp_path, case):
    folder, budget, expected = base
    damaged = tmp_path / "p"
    shutil.copytree(folder, damaged)
    how = damage(damaged, np.random.default_rng(case))
    with deadline(20):
        try:
            profile = Profile.load(damaged)
        except ProfileError as error:
            message = str(error)
            assert str(damaged) in message and "\n" not in message, (how, message)
            return
        assert plan_of(profile, budget) == expected, how
