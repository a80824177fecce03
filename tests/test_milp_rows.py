"""Every row of the MILP bound's program holds for the plans the simulator runs.

The bound is a relaxation only if each row is satisfied by the true values of its columns
for every plan that fits: the classes, the iteration time, compute's arrival at each
boundary and each forward op's start (from a recorded simulation), the swap-out queue's
progress, and the gates of recompute chains and whole swap-ins. These tests compute those
values from simulations of many plans (optimal, pooch's, random ones that fit) on random
networks and links, and check every row directly, without the solver; the bound tests in
test_planner_scale.py check the solved program against the exact optimum.
"""
from __future__ import annotations

import numpy as np
import pytest

from pooch_ext.analytic.synthetic import random_profile
from pooch_ext.milp_bound import Program, build_program, milp_bound
from pooch_ext.milp_needs import queue_order
from pooch_ext.policies import get_policy
from pooch_ext.sim.budgets import budget_between, fits
from pooch_ext.sim.engine import run
from pooch_ext.sim.lifetimes import lifetimes
from pooch_ext.sim.model import KEEP, RECOMPUTE, SWAP, SimModel, codes_of, compile_profile


def true_columns(model: SimModel, codes: np.ndarray, budget: int, program: Program) -> np.ndarray:
    """The value of each column for the plan ``codes`` as the simulator runs it."""
    result = run(model, codes, "early", budget, record=True)
    assert result.feasible and result.trace is not None, result.reason
    trace, at, m = result.trace, program.at, model.m
    x = np.zeros(program.width)
    for i, c in enumerate(codes.tolist()):
        x[c * m + i] = 1.0
    x[at.T] = result.time_s
    arrival, start = np.asarray(trace["arrival"]), np.asarray(trace["start"])
    for b in range(model.n_fwd, model.n + 1):
        x[at.A + b] = arrival[b]
    for b in range(model.n_fwd):
        x[at.F + b] = start[b]
    copied = {(i, way): (b, end) for i, way, b, _, end in trace["transfers"]}
    done = 0.0
    for k, i in enumerate(queue_order(model).tolist()):
        if codes[i] == SWAP:
            done = max(done, copied[(i, "d2h")][1])
        x[at.D + k] = max(done, arrival[model.producer[i] + 1])
    recomputed = codes == RECOMPUTE
    for col, _, path in program.gates:
        x[col] = float(all(recomputed[list(path)]))
    for s, segments in program.lowered.items():
        reach = 0.0
        for e, presence, needed in segments:
            reach = max([reach] + [x[col] for col, source, path in program.gates
                                   if source == s and model.bwd_first[path[-1]] == e])
            x[presence] = reach * (codes[s] != KEEP)
            if needed >= 0:
                x[needed] = reach * (codes[s] == SWAP)
    rebuilt_at = lifetimes(model, codes).rc_point
    for col, y, q in program.rebuilt:
        x[col] = float(codes[y] == RECOMPUTE and rebuilt_at[y] <= q)
    for o, s, q in program.binaries:
        n_q = [x[n] for e, _, n in program.lowered.get(s, ()) if e <= q and n >= 0]
        issued = copied.get((s, "h2d"), (model.n + 1, 0.0))[0]
        x[o] = float(codes[s] == SWAP and not (n_q and n_q[-1]) and issued <= q)
    return x


def violations(program: Program, x: np.ndarray) -> list[str]:
    """The rows ``x`` breaks, described."""
    out = []
    for k, (cols, low) in enumerate(program.rows + program.queues):
        value = sum(v * x[c] for c, v in cols.items())
        if value < low - 1e-9 * max(1.0, abs(low)):
            out.append(f"row {k}: {value!r} < {low!r}")
    for k, (cols, _) in enumerate(program.memory):
        value = sum(v * x[c] for c, v in cols.items())
        if value > program.room[k] + 1.0:
            out.append(f"memory row {k}: {value!r} > {program.room[k]!r}")
    return out


def plans_that_fit(model: SimModel, budget: int, seed: int, count: int) -> list[np.ndarray]:
    """Random classes (each map's allowed ones) that fit ``budget``, up to ``count``."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(40 * count):
        codes = np.array([rng.choice(np.flatnonzero(row)) for row in model.can], np.int64)
        if fits(model, codes, budget) and run(model, codes, "early", budget).feasible:
            out.append(codes)
            if len(out) == count:
                break
    return out


@pytest.mark.parametrize("seed,layers,link,fraction", [
    (0, 9, "pcie3", 0.1), (3, 10, "cpu", 0.0), (5, 12, "nvlink2", 0.25),
    (8, 9, "cpu", 0.1), (11, 14, "pcie3", 0.45), (2, 20, "pcie3", 0.2)])
def test_every_row_holds_for_the_plans_the_simulator_runs(seed, layers, link, fraction):
    profile = random_profile(seed, n_layers=layers)
    model = compile_profile(profile, link)
    budget = budget_between(profile, fraction)
    program = build_program(model, budget)
    plans = plans_that_fit(model, budget, seed, 12)
    plans.append(codes_of(model, get_policy("pooch").classify(profile, budget, link).classes))
    assert len(plans) >= 4
    for codes in plans:
        assert violations(program, true_columns(model, codes, budget, program)) == [], codes


@pytest.mark.parametrize("seed,layers,link", [(2, 20, "pcie3"), (6, 7, "cpu"), (9, 16, "nvlink2")])
def test_the_gates_are_exact_for_integral_classes(seed, layers, link):
    """With the classes fixed, the rows among classes and gates alone pin every gate, P_e and
    N_e to its true value (true_columns) from both sides: without the rows from above
    (milp_needs.exact_gate_rows) the solver could raise them and count a map as partly on
    the device where it cannot be whole."""
    from scipy.optimize import linprog

    profile = random_profile(seed, n_layers=layers)
    model = compile_profile(profile, link)
    budget = budget_between(profile, 0.1)
    program = build_program(model, budget)
    columns = sorted({c for c, _, _ in program.gates}
                     | {c for segments in program.lowered.values()
                        for _, p, n in segments for c in (p, n) if c >= 0})
    assert columns, "a network with recompute chains"
    inside = set(columns) | set(range(3 * model.m))
    rows = [(cols, low) for cols, low in program.rows if set(cols) <= inside]
    matrix = np.zeros((len(rows), program.width))
    for k, (cols, _) in enumerate(rows):
        for c, v in cols.items():
            matrix[k, c] = v
    low = np.array([low for _, low in rows])
    for codes in plans_that_fit(model, budget, seed, 6):
        truth = true_columns(model, codes, budget, program)
        bounds = [(truth[c], truth[c]) if c < 3 * model.m else (0, None)
                  if c in inside else (0, 0) for c in range(program.width)]
        for sign in (1.0, -1.0):
            cost = np.zeros(program.width)
            cost[columns] = sign
            solved = linprog(cost, A_ub=-matrix, b_ub=-low, bounds=bounds, method="highs")
            assert solved.status == 0
            assert np.allclose(solved.x[columns], truth[columns], atol=1e-7), codes


@pytest.mark.parametrize("seed,layers,link,rows", [(9, 10, "cpu", "exact_gate_rows"),
                                                    (9, 14, "cpu", "shared_peak_rows"),
                                                    (6, 10, "pcie3", "late_recompute_rows")])
def test_each_kind_of_row_tightens_the_bound(monkeypatch, seed, layers, link, rows):
    """Exact chains, shared peaks and late recomputes each raise the bound where they matter
    (random networks at 0.1 of the way to in-core: by 5-7%), and it stays below the time
    of a plan that runs."""
    import pooch_ext.milp_bound as milp_module

    profile = random_profile(seed, n_layers=layers)
    model = compile_profile(profile, link)
    budget = budget_between(profile, 0.1)
    plan = get_policy("pooch").classify(profile, budget, link)
    bound = milp_bound(model, budget, time_limit_s=30)
    none = (lambda model, at, col: ([], col, [])) if rows == "late_recompute_rows" \
        else (lambda *args: [])
    monkeypatch.setattr(milp_module, rows, none)
    without = milp_bound(model, budget, time_limit_s=30)
    assert bound.optimal and without.optimal
    assert 1.04 * without.bound_s < bound.bound_s <= plan.iteration_time_s * (1 + 1e-9)


def test_the_checks_find_a_row_a_plan_breaks():
    """The check above can fail: a row claiming more than the simulator gives is found."""
    profile = random_profile(2, n_layers=20)
    model = compile_profile(profile, "pcie3")
    budget = budget_between(profile, 0.2)
    program = build_program(model, budget)
    codes = codes_of(model, get_policy("pooch").classify(profile, budget, "pcie3").classes)
    x = true_columns(model, codes, budget, program)
    program.rows.append(({program.at.T: 1.0}, float(x[program.at.T]) * 1.01))
    assert len(violations(program, x)) == 1


@pytest.mark.parametrize("link,old,proven", [("cpu", 0.038, 0.98), ("pcie3", 0.597, 0.88)])
def test_recompute_chains_and_queues_tighten_the_bound(link, old, proven):
    """A network whose best plans rebuild chains at its minimum budget: the first rows
    alone proved ``old`` of its optimum (the chains' sources needed early were left out);
    the sources' memory and needs, the swap-out queue and whole swap-ins prove ``proven``
    or more, still below it (results/gap/bound_check.csv)."""
    from pooch_ext.exact import exact_best

    profile = random_profile(6, n_layers=7)
    model = compile_profile(profile, link)
    budget = budget_between(profile, 0.0)
    best = exact_best(model, budget).time_s
    bound = milp_bound(model, budget, time_limit_s=30)
    assert bound.optimal
    assert proven * best <= bound.bound_s <= best * (1 + 1e-9)


def test_a_time_limit_before_any_solution_gives_the_dual_bound_not_an_error(monkeypatch):
    """HiGHS may stop at its time limit with no solution yet (status 1, x None): the bound
    is then its dual bound (at least every op's time), unfinished, with no plan to run."""
    import types

    import pooch_ext.milp_bound as milp_module

    profile = random_profile(4, n_layers=9)
    model = compile_profile(profile, "pcie3")
    budget = budget_between(profile, 0.25)
    floor = float(model.dur.sum())
    for dual in (float("nan"), 0.5 * floor, 1.5 * floor):
        monkeypatch.setattr(milp_module, "milp", lambda dual=dual, **_: types.SimpleNamespace(
            x=None, status=1, message="time limit reached", mip_dual_bound=dual))
        bound = milp_bound(model, budget, time_limit_s=5)
        assert bound.bound_s == (dual if dual > floor else floor)
        assert not bound.optimal and bound.plan_time_s == float("inf")
        assert all(model.can[i, c] for i, c in enumerate(bound.codes))
    monkeypatch.setattr(milp_module, "milp", lambda **_: types.SimpleNamespace(
        x=None, status=4, message="numerical trouble", mip_dual_bound=floor))
    with pytest.raises(RuntimeError, match="numerical trouble"):
        milp_bound(model, budget, time_limit_s=5)


def test_the_solvers_own_prints_do_not_reach_the_users_output():
    """HiGHS prints a line of its own from C++ even with its output off; during a solve the
    process's standard output goes nowhere, C's buffer included (a pipe: fully buffered, so
    what a solve leaves there would come out at exit), and comes back after."""
    import os
    import subprocess
    import sys

    code = ("import ctypes, os\n"
            "from pooch_ext import milp_bound\n"
            "print('before', flush=True)\n"
            "with milp_bound._solver_output_dropped():\n"
            "    os.write(1, b'written by C\\n')\n"
            "    ctypes.CDLL(None).printf(b'buffered by C\\n')\n"
            "print('after', flush=True)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "before\nafter\n"
