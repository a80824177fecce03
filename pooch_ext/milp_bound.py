"""A proven lower bound on the best plan of a real network: a mixed-integer relaxation of
keep / swap / recompute with the copy engines' timing, solved by HiGHS (scipy.optimize.milp).

pooch is a heuristic and the exact search (exact.py) stops at about 16 feature maps. This
bound reaches ResNet-50 (105 maps) in seconds. One binary per (map, class), one continuous
iteration time T, and only constraints that every plan's simulated time obeys, so the
optimum of the program is at most the best plan's time (the gap of pooch to it is an upper
bound of pooch's distance to the optimum):

* memory, at every boundary: each map present from its producer to its last forward read
  and from its first backward need to its final drop, plus, if kept, the hole between
  (the simulator's tightest memory, ``static_top(minimal=True)``; the recompute chains' own
  scratch and the earlier needs a recompute gives its sources are left out, which only
  lowers memory);
* compute: every op and every recompute, back to back (sim/bounds.compute_floor);
* each swapped map: forward up to its producer, its swap-out, its swap-in (not before the
  backward pass starts), then every op from its first backward need on;
* the copy engines, one copy at a time: for every forward boundary p and backward boundary
  q, the swapped maps made after p and needed by q send all their swap-outs between the
  time compute reaches p and the time it must resume at q (the same for swap-ins, which
  start after the forward pass);
* memory while copies run (``_copy_memory_rows``): a swapped map leaves the device only once
  its swap-out is done and is back from its swap-in's start, and an engine moves at most its
  fastest copy's bytes a second, so a saturated link holds maps on the device: compute
  stalls in the forward pass (its op start times are columns too) or prefetches hold memory.
  On ResNet-50 b512 pcie3 at 0.4 of in-core this raised the bound from 1.653 to 1.700 s.

Action costs and the engines' exact queue order are left out (they only add time). The
program's plan is simulated too: where it fits it is a real plan and an upper bound.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from pooch_ext.errors import BudgetTooSmallError
from pooch_ext.policies.search import KeepRoom
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
    m, n, n_fwd = model.m, model.n, model.n_fwd
    if m == 0:      # nothing to classify: the ops back to back (no program to solve)
        return MilpBound(float(model.dur.sum()), True, np.zeros(0, np.int64),
                         run(model, np.zeros(0, np.int64), "early", budget).time_s,
                         time.perf_counter() - started, 0)
    # classes, T, compute's arrival at each backward boundary, then at each forward one
    width = 3 * m + 1 + (n + 1 - n_fwd) + n_fwd
    rows = _time_rows(model)
    memory, room = _memory_rows(model, budget)
    copying, copy_room = _copy_memory_rows(model, room)
    memory, room = memory + copying, np.concatenate([room, copy_room])
    can = model.can.astype(float)
    upper = np.concatenate([can[:, KEEP], can[:, SWAP], can[:, RECOMPUTE],
                            np.full(width - 3 * m, math.inf)])
    cost = np.zeros(width)
    cost[3 * m] = 1.0
    result = milp(c=cost, integrality=np.r_[np.ones(3 * m), np.zeros(width - 3 * m)],
                  bounds=Bounds(np.zeros(width), upper),
                  constraints=[
                      LinearConstraint(_sparse(rows, width), [low for _, low in rows], np.inf),
                      # in units of the budget: bytes beside seconds upset HiGHS's numerics
                      LinearConstraint(_sparse(memory, width) / budget, -np.inf, room / budget),
                      LinearConstraint(_sparse([({i: 1.0, m + i: 1.0, 2 * m + i: 1.0}, 1.0)
                                                for i in range(m)], width), 1.0, 1.0)],
                  options={"time_limit": time_limit_s, "disp": False})
    seconds = time.perf_counter() - started
    if result.x is None:     # (at or above the minimum, all swapped fits: never infeasible)
        raise RuntimeError(f"the bound's program was not solved: {result.message}")
    codes = np.argmax(np.round(result.x[:3 * m]).reshape(3, m), axis=0).astype(np.int64)
    plan_time = (run(model, codes, "early", budget).time_s if fits(model, codes, budget)
                 else math.inf)
    # the solver's dual bound, not its best objective: HiGHS calls a program solved once the
    # two are within its relative gap (1e-4), so the objective may exceed the true minimum
    bound = min(float(result.fun), float(result.mip_dual_bound))
    optimal = result.status == 0
    return MilpBound(bound, optimal, codes, plan_time, seconds, len(rows) + n + 1)


Rows = list[tuple[dict[int, float], float]]     # ({column: coefficient}, lower bound)


def _time_rows(model: SimModel) -> Rows:
    """The timing constraints (columns: keep, swap, recompute per map, T, then the compute's
    arrival at each backward boundary)."""
    m, n, n_fwd = model.m, model.n, model.n_fwd
    reached = np.concatenate([[0.0], np.cumsum(model.dur)])     # compute at boundary b
    produced = model.producer + 1               # swap-out starts (boundary)
    needed = model.bwd_first                    # first backward need, itself a bound
    T = 3 * m
    A = T + 1 - n_fwd                           # A + b: compute arrives at boundary b >= n_fwd
    # compute: T >= all ops + the recomputes, and the backward pass op by op
    rows: Rows = [({T: 1.0, **{2 * m + i: -float(model.rc_s[i]) for i in range(m)}},
                   float(reached[-1])), ({A + n_fwd: 1.0}, float(reached[n_fwd]))]
    rows += [({A + b + 1: 1.0, A + b: -1.0}, float(model.dur[b])) for b in range(n_fwd, n)]
    rows.append(({T: 1.0, A + n: -1.0}, 0.0))
    # the forward pass op by op (it stalls where memory waits for swap-outs), then every
    # backward op and recompute after it
    F = A + n + 1                               # F + b: forward op b starts (b < n_fwd)
    rows += [({(F + b + 1 if b + 1 < n_fwd else A + n_fwd): 1.0, F + b: -1.0},
              float(model.dur[b])) for b in range(n_fwd)]
    rows.append(({T: 1.0, A + n_fwd: -1.0, **{2 * m + i: -float(model.rc_s[i])
                                               for i in range(m)}},
                 float(reached[-1] - reached[n_fwd])))
    # each swapped map: forward to its producer, out, in after the forward pass, its op
    for i in np.flatnonzero(model.can[:, SWAP]):
        q = int(needed[i])
        ready = max(reached[n_fwd], reached[produced[i]] + model.so_s[i]) + model.si_s[i]
        rows.append(({A + q + 1: 1.0, m + i: -float(ready)}, float(model.dur[q])))
    # the copy engines, one copy at a time
    for q in np.unique(needed):
        maps = np.flatnonzero(needed <= q)
        rows.append(({A + q + 1: 1.0, A + n_fwd: -1.0,
                      **{m + int(i): -float(model.si_s[i]) for i in maps}}, float(model.dur[q])))
        for p in np.unique(produced[maps]):
            inside = maps[produced[maps] >= p]
            rows.append(({A + q + 1: 1.0, **{m + int(i): -float(model.so_s[i]) for i in inside}},
                         float(reached[p] + model.dur[q])))
    return rows


def _memory_rows(model: SimModel, budget: int) -> tuple[Rows, np.ndarray]:
    """Per boundary: each kept map's hole, and the room the tightest level with no map kept
    leaves under ``budget``."""
    room = KeepRoom(model, np.full(model.m, SWAP), budget)   # the keep walk's holes
    memory: list[dict[int, float]] = [{} for _ in range(model.n + 1)]
    for i in range(model.m):
        for b in range(int(room.lo[i]), int(room.hi[i])):
            memory[b][i] = float(model.nbytes[i])
    return [(cols, 0.0) for cols in memory], budget - room.top.astype(float)


def _copy_memory_rows(model: SimModel, room: np.ndarray) -> tuple[list[tuple[dict[int, float], float]],
                                                                    np.ndarray]:
    """Memory that copies hold, tied to time: a swapped map stays on the device until its
    swap-out is done, and comes back when its swap-in starts, and each engine moves at most
    ``bandwidth`` bytes a second (its fastest copy's), one copy at a time.

    * Forward op b: of the swapped maps no op from b on reads, at most bandwidth x (op b's
      start - the earliest of their swap-outs' starts) bytes are released by then; the rest
      are on the device during op b.
    * Backward boundary q and a later need q2: the swapped maps first needed after q up to
      q2 that are not on the device during op q are all copied in after op q, before op q2
      starts: at most bandwidth x (A[q2 + 1] - dur[q2] - A[q + 1]) bytes of them.
    """
    m, n, n_fwd = model.m, model.n, model.n_fwd
    swappable = np.flatnonzero(model.can[:, SWAP])
    rows: list[tuple[dict[int, float], float]] = []
    rhs: list[float] = []
    if len(swappable) == 0:
        return rows, np.zeros(0)
    nbytes = model.nbytes.astype(float)
    reached = np.concatenate([[0.0], np.cumsum(model.dur)])
    holes = KeepRoom(model, np.full(m, SWAP), 0)
    T = 3 * m
    A, F = T + 1 - n_fwd, T + 1 + (n + 1 - n_fwd)

    def kept_at(b: int) -> dict[int, float]:
        return {i: nbytes[i] for i in range(m) if holes.lo[i] <= b < holes.hi[i]}

    out_rate = _bandwidth(nbytes[swappable], model.so_s[swappable])
    starts = reached[model.producer + 1]
    for b in range(1, n_fwd):
        gone = swappable[model.last_fwd[swappable] < b]
        if len(gone) == 0 or not math.isfinite(out_rate):
            continue
        cols = kept_at(b)
        cols.update({m + int(i): nbytes[i] for i in gone})
        cols[F + b] = -out_rate
        rows.append((cols, 0.0))
        rhs.append(float(room[b]) - out_rate * float(starts[gone].min()))
    in_rate = _bandwidth(nbytes[swappable], model.si_s[swappable])
    needs = np.unique(model.bwd_first[swappable])
    if math.isfinite(in_rate):
        for q in range(n_fwd, n):
            later = needs[needs > q][:_NEED_WINDOW]
            for q2 in later.tolist():
                coming = swappable[(model.bwd_first[swappable] > q)
                                   & (model.bwd_first[swappable] <= q2)]
                cols = kept_at(q)
                cols.update({m + int(i): nbytes[i] for i in coming})
                cols[A + q2 + 1] = cols.get(A + q2 + 1, 0.0) - in_rate
                cols[A + q + 1] = cols.get(A + q + 1, 0.0) + in_rate
                rows.append((cols, 0.0))
                rhs.append(float(room[q]) - in_rate * float(model.dur[q2]))
    return rows, np.array(rhs)


_NEED_WINDOW = 12   # the later needs each backward boundary is tied to


def _bandwidth(nbytes: np.ndarray, seconds: np.ndarray) -> float:
    """The most bytes a second any of these copies moves (inf where one takes no time)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(seconds > 0, nbytes / np.maximum(seconds, 1e-300), math.inf)
    return float(rate.max())


def _sparse(rows: Rows, width: int) -> coo_matrix:
    """The rows' coefficients as one sparse matrix."""
    r, c, v = [], [], []
    for k, (cols, _) in enumerate(rows):
        r += [k] * len(cols)
        c += list(cols)
        v += list(cols.values())
    return coo_matrix((v, (r, c)), shape=(len(rows), width))
