"""The MILP bound's rows for compute, memory and the copy engines (milp_bound.py): columns
follow milp_needs.Layout, and every row holds for every plan the simulator runs."""
from __future__ import annotations

import math

import numpy as np

from pooch_ext.milp_needs import (NEED_WINDOW, Layout, Lowered, Rows, add_scaled, need_points,
                                  needed_by, reached)
from pooch_ext.sim.bounds import seconds_from
from pooch_ext.policies.search import KeepRoom
from pooch_ext.sim.model import RECOMPUTE, SWAP, SimModel


def time_rows(model: SimModel, at: Layout) -> Rows:
    """Compute, op by op in each pass, with the recomputes; each swapped map's copies; the
    copy engines one copy at a time."""
    m, n, n_fwd, T, A, F = model.m, model.n, model.n_fwd, at.T, at.A, at.F
    at_reach = reached(model)
    produced = model.producer + 1               # swap-out starts (boundary)
    needed = model.bwd_first                    # first backward need, itself a bound
    recompute_all = {2 * m + i: -float(model.rc_s[i]) for i in range(m)}
    # T >= all ops + the recomputes; the backward pass op by op
    rows: Rows = [({T: 1.0, **recompute_all}, float(at_reach[-1])),
                  ({A + n_fwd: 1.0}, float(at_reach[n_fwd]))]
    rows += [({A + b + 1: 1.0, A + b: -1.0}, float(model.dur[b])) for b in range(n_fwd, n)]
    rows.append(({T: 1.0, A + n: -1.0}, 0.0))
    # the forward pass op by op (it stalls where memory waits for swap-outs), then every
    # backward op and recompute after it
    rows += [({(F + b + 1 if b + 1 < n_fwd else A + n_fwd): 1.0, F + b: -1.0},
              float(model.dur[b])) for b in range(n_fwd)]
    rows.append(({T: 1.0, A + n_fwd: -1.0, **recompute_all},
                 float(at_reach[-1] - at_reach[n_fwd])))
    # a recompute runs before its map's first need, so the ones needed by q come before it
    # (those after it: late_recompute_rows)
    rebuilt = np.flatnonzero(model.can[:, RECOMPUTE])
    for q in range(n_fwd, n):
        rows.append(({A + q + 1: 1.0, A + n_fwd: -1.0,
                      **{2 * m + int(i): -float(model.rc_s[i])
                         for i in rebuilt[needed[rebuilt] <= q]}},
                     float(at_reach[q + 1] - at_reach[n_fwd])))
    # each swapped map: forward to its producer, out, in after the forward pass, its op
    for i in np.flatnonzero(model.can[:, SWAP]):
        q = int(needed[i])
        ready = max(at_reach[n_fwd], at_reach[produced[i]] + model.so_s[i]) + model.si_s[i]
        rows.append(({A + q + 1: 1.0, m + i: -float(ready)}, float(model.dur[q])))
    # the copy engines, one copy at a time
    for q in np.unique(needed):
        maps = np.flatnonzero(needed <= q)
        rows.append(({A + q + 1: 1.0, A + n_fwd: -1.0,
                      **{m + int(i): -float(model.si_s[i]) for i in maps}}, float(model.dur[q])))
        for p in np.unique(produced[maps]):
            inside = maps[produced[maps] >= p]
            rows.append(({A + q + 1: 1.0, **{m + int(i): -float(model.so_s[i]) for i in inside}},
                         float(at_reach[p] + model.dur[q])))
    return rows


def late_recompute_rows(model: SimModel, at: Layout,
                        first_col: int) -> tuple[Rows, int, list[tuple[int, int, int]]]:
    """The recomputes after a stall add to it: for each backward boundary q, T >= compute's
    arrival after op q + the ops after it + every recompute not yet run by q. A map is
    rebuilt at its first backward need or where a recompute of a map reading it runs,
    whichever is earlier (sim/lifetimes.py), so "rebuilt by q" is bounded from above by a
    column H(y, q) <= r_y and, where y's own need is after q, H(y, q) <= the sum of
    H(z, q) over the recomputable maps z reading y (readers first: their ids are larger):
    the most each can be is its true value for integral classes, to any depth of chain.
    A row that counted only the maps no chain could rebuild by q (their earliest possible
    rebuild after it) missed nearly every recompute of ResNet-50, whose chains reach back
    across the network: with these the bound there (b512 pcie3, 0.3 of the in-core need)
    rose from 1806.6 to 1852.1 ms. Returns the rows, the next free column and the columns
    H as (column, map, boundary)."""
    m, T, A = model.m, at.T, at.A
    col = first_col
    recomputable = np.flatnonzero(model.can[:, RECOMPUTE]).tolist()
    readers: list[list[int]] = [[] for _ in range(m)]
    for y in recomputable:
        for s in model.src_fm[y]:
            readers[s].append(y)
    after = seconds_from(model)
    rows: Rows = []
    columns: list[tuple[int, int, int]] = []
    for q in range(model.n_fwd, model.n):
        by_q: dict[int, dict[int, float]] = {}      # y: the columns bounding H(y, q)
        late = {T: 1.0, A + q + 1: -1.0}
        for y in recomputable[::-1]:
            if model.bwd_first[y] <= q:
                by_q[y] = {2 * m + y: 1.0}
                continue
            by_readers: dict[int, float] = {}
            for z in readers[y]:
                add_scaled(by_readers, by_q[z])
            by_q[y] = {}
            if by_readers:
                rows += [({2 * m + y: 1.0, col: -1.0}, 0.0), ({**by_readers, col: -1.0}, 0.0)]
                columns.append((col, y, q))
                by_q[y] = {col: 1.0}
                col += 1
            rc = float(model.rc_s[y])
            late[2 * m + y] = -rc
            add_scaled(late, by_q[y], rc)
        rows.append((late, float(after[q + 1])))
    return rows, col, columns


def all_swapped(model: SimModel, budget: int) -> KeepRoom:
    """The keep walk's room from every map swapped: each map's hole (``lo``, ``hi``) and the
    tightest level with no map kept (``top``), what the memory rows and the whole swap-ins'
    peaks (milp_needs.prefetch_rows) start from."""
    return KeepRoom(model, np.full(model.m, SWAP), budget)


def memory_rows(model: SimModel, holes: KeepRoom) -> tuple[Rows, np.ndarray]:
    """Per boundary: each kept map's hole, and the room the tightest level with no map kept
    leaves under the budget (``holes``: ``all_swapped``)."""
    memory: list[dict[int, float]] = [{} for _ in range(model.n + 1)]
    for i in range(model.m):
        for b in range(int(holes.lo[i]), int(holes.hi[i])):
            memory[b][i] = float(model.nbytes[i])
    return [(cols, 0.0) for cols in memory], holes.budget - holes.top.astype(float)


def copy_memory_rows(model: SimModel, at: Layout, room: np.ndarray, memory: Rows,
                     lowered: Lowered) -> tuple[Rows, np.ndarray]:
    """Memory that copies hold, tied to time: a swapped map stays on the device until its
    swap-out is done, and comes back when its swap-in starts, and each engine moves at most
    ``bandwidth`` bytes a second (its fastest copy's), one copy at a time.

    * Forward op b: of the swapped maps no op from b on reads, at most bandwidth x (op b's
      start - the earliest of their swap-outs' starts) bytes are released by then; the rest
      are on the device during op b.
    * Backward boundary q and a later need q2: the swapped maps first needed after q up to
      q2 (recompute chains included: N(q2) - N(q), milp_needs.needed_by) that are not on
      the device during op q are all copied in after op q, before op q2 starts: at most
      bandwidth x (A[q2 + 1] - dur[q2] - A[q + 1]) bytes of them.

    Each row starts from ``memory``'s at its boundary (kept maps, recompute sources).
    """
    m, n, n_fwd, A, F = model.m, model.n, model.n_fwd, at.A, at.F
    swappable = np.flatnonzero(model.can[:, SWAP])
    rows: Rows = []
    rhs: list[float] = []
    if len(swappable) == 0:
        return rows, np.zeros(0)
    nbytes = model.nbytes.astype(float)
    out_rate = bandwidth(nbytes[swappable], model.so_s[swappable])
    starts = reached(model)[model.producer + 1]
    for b in range(1, n_fwd):
        gone = swappable[model.last_fwd[swappable] < b]
        if len(gone) == 0 or not math.isfinite(out_rate):
            continue
        cols = dict(memory[b][0])
        cols.update({m + int(i): nbytes[i] for i in gone})
        cols[F + b] = -out_rate
        rows.append((cols, 0.0))
        rhs.append(float(room[b]) - out_rate * float(starts[gone].min()))
    in_rate = bandwidth(nbytes[swappable], model.si_s[swappable])
    if not math.isfinite(in_rate):
        return rows, np.array(rhs)
    # the boundaries where a map's "swapped and needed by" changes: its own first need and
    # its recompute chains' (only those maps' terms differ between q and q2)
    changes: dict[int, set[int]] = {}
    for i in swappable.tolist():
        for e in need_points(model, lowered, i):
            changes.setdefault(e, set()).add(i)
    needs = np.array(sorted(changes), np.int64)
    for q in range(n_fwd, n):
        coming: set[int] = set()
        for q2 in needs[needs > q][:NEED_WINDOW].tolist():
            coming |= changes[q2]
            cols = dict(memory[q][0])
            for i in sorted(coming):
                add_scaled(cols, needed_by(model, lowered, i, q2), nbytes[i])
                add_scaled(cols, needed_by(model, lowered, i, q), -nbytes[i])
            cols[A + q2 + 1] = cols.get(A + q2 + 1, 0.0) - in_rate
            cols[A + q + 1] = cols.get(A + q + 1, 0.0) + in_rate
            rows.append((cols, 0.0))
            rhs.append(float(room[q]) - in_rate * float(model.dur[q2]))
    return rows, np.array(rhs)


def bandwidth(nbytes: np.ndarray, seconds: np.ndarray) -> float:
    """The most bytes a second any of these copies moves (inf where one takes no time)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(seconds > 0, nbytes / np.maximum(seconds, 1e-300), math.inf)
    return float(rate.max())
