"""A proven lower bound on the best plan of a real network: a mixed-integer relaxation of
keep / swap / recompute with the copy engines' timing, solved by HiGHS (scipy.optimize.milp).

pooch is a heuristic and the exact search (exact.py) stops at about 16 feature maps. This
bound reaches ResNet-50 (105 maps) in seconds to a minute. One binary per (map, class), one
continuous iteration time T, and only constraints that every plan's simulated time obeys,
so the optimum of the program is at most the best plan's time (the gap of pooch to it is an
upper bound of pooch's distance to the optimum). The rows (milp_rows.py, milp_needs.py):

* memory, at every boundary: each map present from its producer to its last forward read
  and from its first backward need to its final drop, plus, if kept, the hole between
  (the simulator's tightest memory, ``static_top(minimal=True)``), plus the sources a
  recompute chain needs earlier (the chains' own scratch is left out, which only lowers
  memory);
* compute: every op and every recompute, back to back (sim/bounds.compute_floor), and in
  the backward pass the recomputes that must come after a stall: those not rebuilt by
  then, with "rebuilt by" exact to any depth of chain (milp_rows.late_recompute_rows);
* each swapped map: forward up to its producer, its swap-out, its swap-in (not before the
  backward pass starts, nor before the swap-out queue reaches it: swap-outs leave in
  producer order), then every op from its first backward need on, or from the first need
  of a recompute chain that reads it;
* the copy engines, one copy at a time: for every forward boundary p and backward boundary
  q, the swapped maps made after p and needed by q send all their swap-outs between the
  time compute reaches p and the time it must resume at q (the same for swap-ins, which
  start after the forward pass and after the swap-out queue has reached them);
* memory while copies run: a swapped map leaves the device only once its swap-out is done
  and is back from its swap-in's start, and an engine moves at most its fastest copy's
  bytes a second, so a saturated link holds maps on the device: compute stalls in the
  forward pass (its op start times are columns too) or prefetches hold memory; and a map
  is copied in whole, so at the memory peaks before its need it is either all on the
  device or all copied in after the peak (a binary each); those copied in after a peak
  share the engine one after another (milp_needs.shared_peak_rows);
* recompute chains exactly: a chain's gate is at most each of its recomputes and a map's
  "needed by" at most its chains' gates (milp_needs.exact_gate_rows), so the solver cannot
  count a map as partly needed, and so partly on the device, where it cannot be whole.

Action costs and the engines' exact queue order among swap-ins are left out (they only
add time). The program's plan is simulated too: where it fits it is a real plan and an
upper bound. On ResNet-50 b512 pcie3 at 0.3 of in-core, the rows after the first ones
raised the bound from 1.745 to 1.765 s and its plan's simulated time fell from 2.51 to
2.04 s; the exact chains and the shared peaks raised it to 1.807 s and the late
recomputes to 1.852 s (session 31). On 360 small networks the bound's average distance
below the optimum fell from 9.9% to 2.1% with session 28's rows and to 1.3% with session
31's (results/README "Distance to a proven bound"). Each kind of row was found by fixing a
plan's classes in the program and reading where the simulator's compute ran later than the
program's (``fixed_class_arrivals``, experiments/bound_diagnose.py).
"""
from __future__ import annotations

import ctypes
import math
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from pooch_ext.errors import BudgetTooSmallError
from pooch_ext.milp_needs import (Gates, Layout, Lowered, Rows, exact_gate_rows, prefetch_rows,
                                  queue_rows, shared_peak_rows, source_rows)
from pooch_ext.milp_rows import (all_swapped, copy_memory_rows, late_recompute_rows,
                                 memory_rows, time_rows)
from pooch_ext.sim.budgets import fits, model_minimum
from pooch_ext.sim.engine import run
from pooch_ext.sim.model import KEEP, RECOMPUTE, SWAP, SimModel
from pooch_ext.units import parse_bytes


@dataclass
class MilpBound:
    """The bound (seconds: the solver's dual bound, so it holds whether or not the solve
    finished), whether it finished (to HiGHS's relative gap of 1e-4) within its time limit,
    the program's own plan and its simulated time (inf where it does not fit), and the
    seconds the solve took."""

    bound_s: float
    optimal: bool
    codes: np.ndarray = field(repr=False)
    plan_time_s: float
    seconds: float
    rows: int


def milp_bound(model: SimModel, budget: int | str, time_limit_s: float = 120.0) -> MilpBound:
    """The lower bound of every plan's iteration time for ``model`` under ``budget`` (bytes,
    or a string such as "12GiB"); a budget below the minimum any plan reaches raises
    BudgetTooSmallError, as the policies do."""
    started = time.perf_counter()
    budget = parse_bytes(budget)
    minimum = model_minimum(model)
    if budget < minimum:
        raise BudgetTooSmallError(budget, minimum, "milp_bound")
    m = model.m
    if m == 0:      # nothing to classify: the ops back to back (no program to solve)
        return MilpBound(float(model.dur.sum()), True, np.zeros(0, np.int64),
                         run(model, np.zeros(0, np.int64), "early", budget).time_s,
                         time.perf_counter() - started, 0)
    # the program without the swap-out queue's gated rows first: they are what slows the
    # solver most (ResNeXt-101 3D: 40 s against over 120), and tighten small networks only;
    # then, with the time left, with them; each dual bound holds, so the larger one does
    program = build_program(model, budget)
    solves = [_solve(model, budget, program, time_limit_s, queues=False)]
    left = time_limit_s - (time.perf_counter() - started)
    if left > 0 and program.queues:
        solves.append(_solve(model, budget, program, left, queues=True))
    bound, optimal, _, _, _ = max(solves, key=lambda solve: solve[0])
    _, _, codes, plan_time, _ = min(solves, key=lambda solve: solve[3])
    return MilpBound(bound, optimal, codes, plan_time, time.perf_counter() - started,
                     max(solve[4] for solve in solves))


Solve = tuple[float, bool, np.ndarray, float, int]   # bound, finished, plan, its time, rows


def _solve(model: SimModel, budget: int, program: Program, time_limit_s: float,
           queues: bool) -> Solve:
    """HiGHS on ``program`` (with its queue rows or not): its dual bound, whether it
    finished, the plan of its best solution and that plan's simulated time (inf where it
    does not fit), and its rows."""
    rows = program.rows + (program.queues if queues else [])
    m, memory = model.m, program.memory
    cost = np.zeros(program.width)
    cost[3 * m] = 1.0
    result = _highs(model, budget, program, rows, cost, time_limit_s)
    count = len(rows) + len(memory) + m
    floor = float(model.dur.sum())
    if result.x is None:
        # (every plan that fits satisfies the rows, so the program is never infeasible at
        # or above the minimum; the time limit can still come before a first solution)
        if result.status != 1:
            raise RuntimeError(f"the bound's program was not solved: {result.message}")
        dual = getattr(result, "mip_dual_bound", None)
        bound = max(floor, float(dual)) if dual is not None and math.isfinite(dual) else floor
        return bound, False, np.argmax(model.can, axis=1).astype(np.int64), math.inf, count
    codes = np.argmax(np.round(result.x[:3 * m]).reshape(3, m), axis=0).astype(np.int64)
    plan_time = (run(model, codes, "early", budget).time_s if fits(model, codes, budget)
                 else math.inf)
    # the solver's dual bound, not its best objective: HiGHS calls a program solved once the
    # two are within its relative gap (1e-4), so the objective may exceed the true minimum
    bound = min(float(result.fun), float(result.mip_dual_bound))
    return max(bound, floor), result.status == 0, codes, plan_time, count


def _highs(model: SimModel, budget: int, program: Program, rows: Rows, cost: np.ndarray,
           time_limit_s: float, fixed: np.ndarray | None = None) -> Any:
    """scipy's HiGHS result for minimising ``cost`` over ``rows`` and the program's memory
    rows, each map in one class (``fixed``: those classes only)."""
    m, memory, room, width = model.m, program.memory, program.room, program.width
    can = model.can.astype(float)
    upper = np.concatenate([can[:, KEEP], can[:, SWAP], can[:, RECOMPUTE],
                            np.full(width - 3 * m, math.inf)])
    lower = np.zeros(width)
    if fixed is not None:
        chosen = np.asarray(fixed) * m + np.arange(m)
        upper[:3 * m] = 0.0
        upper[chosen] = lower[chosen] = 1.0
    integral = np.zeros(width)
    integral[:3 * m] = 1
    whole = [o for o, _, _ in program.binaries]
    integral[whole] = 1
    upper[whole] = 1.0
    with _solver_output_dropped():
        return milp(c=cost, integrality=integral, bounds=Bounds(lower, upper),
                    constraints=[
                        LinearConstraint(_sparse(rows, width), [low for _, low in rows], np.inf),
                        # in units of the budget: bytes beside seconds upset HiGHS's numerics
                        LinearConstraint(_sparse(memory, width) / budget, -np.inf, room / budget),
                        LinearConstraint(_sparse([({i: 1.0, m + i: 1.0, 2 * m + i: 1.0}, 1.0)
                                                  for i in range(m)], width), 1.0, 1.0)],
                    options={"time_limit": max(time_limit_s, 1e-3), "disp": False})


def fixed_class_arrivals(model: SimModel, budget: int | str, codes: np.ndarray,
                         time_limit_s: float = 120.0) -> tuple[float, np.ndarray]:
    """The program with every map's class fixed to ``codes``: its least iteration time, and
    with that time, compute's earliest arrival at each backward boundary (n_fwd .. n). Where
    the simulator's arrivals for the same plan run ahead of these, the program leaves out
    what holds the plan back there: how its rows were found (experiments/bound_diagnose.py).
    """
    budget = parse_bytes(budget)
    program = build_program(model, budget)
    rows, at = program.rows + program.queues, program.at
    cost = np.zeros(program.width)
    cost[at.T] = 1.0
    def solved(rows: Rows) -> np.ndarray:
        result = _highs(model, budget, program, rows, cost, time_limit_s, fixed=codes)
        if result.x is None:
            raise RuntimeError(f"the program with these classes was not solved: {result.message}")
        return result.x

    least = float(solved(rows)[at.T])
    cost[at.T] = 0.0
    cost[at.A + model.n_fwd:at.A + model.n + 1] = 1.0
    arrivals = solved(rows + [({at.T: -1.0}, -least * (1 + 1e-9))])
    return least, arrivals[at.A + model.n_fwd:at.A + model.n + 1].copy()


@dataclass
class Program:
    """The program's rows: ``rows`` and ``queues`` (the swap-out queue's gated rows,
    milp_needs.queue_rows) are at least their bounds, ``memory`` at most ``room`` (bytes);
    ``width`` columns (milp_needs.Layout, then the gates of ``lowered``, ``gates``,
    ``binaries`` and ``rebuilt`` (milp_rows.late_recompute_rows), which are kept for
    checking the rows against simulated plans)."""

    rows: Rows
    queues: Rows
    memory: Rows
    room: np.ndarray
    width: int
    at: Layout
    lowered: Lowered
    gates: Gates
    binaries: list[tuple[int, int, int]]
    rebuilt: list[tuple[int, int, int]]


def build_program(model: SimModel, budget: int) -> Program:
    """Every row of the program for ``model`` under ``budget`` bytes (at least one map)."""
    at = Layout.of(model)
    rows = time_rows(model, at)
    holes = all_swapped(model, budget)
    memory, room = memory_rows(model, holes)
    sources, width, lowered, gates = source_rows(model, at, memory, at.free)
    copying, copy_room = copy_memory_rows(model, at, room, memory, lowered)
    prefetch, binaries, width = prefetch_rows(model, at, memory, lowered, width, holes.top)
    exact = exact_gate_rows(model, lowered, gates)
    shared = shared_peak_rows(model, at, lowered, binaries)
    late, width, rebuilt = late_recompute_rows(model, at, width)
    return Program(rows + sources + exact + prefetch + shared + late, queue_rows(model, at),
                   memory + copying, np.concatenate([room, copy_room]), width, at, lowered,
                   gates, binaries, rebuilt)


def _sparse(rows: Rows, width: int) -> coo_matrix:
    """The rows' coefficients as one sparse matrix."""
    r, c, v = [], [], []
    for k, (cols, _) in enumerate(rows):
        r += [k] * len(cols)
        c += list(cols)
        v += list(cols.values())
    return coo_matrix((v, (r, c)), shape=(len(rows), width))


@contextmanager
def _solver_output_dropped() -> Iterator[None]:
    """The process's standard output (file descriptor 1) to the null device for a solve:
    HiGHS prints "HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();"
    from C++ even with its output off (jump-dev/HiGHS.jl#312), into the user's tables and
    progress bars. C's own buffer is emptied before fd 1 is given back, or what HiGHS left in
    it would reach the user later (and before it is taken, so that what was there does).
    Without an fd 1 to redirect, the solve runs as it is."""
    sys.stdout.flush()
    _c_stdio_flushed()
    try:
        saved = os.dup(1)
    except OSError:
        yield
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
        yield
    finally:
        _c_stdio_flushed()
        os.dup2(saved, 1)
        os.close(saved)


def _c_stdio_flushed() -> None:
    """C's ``fflush(NULL)``, where the C library can be loaded."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass
