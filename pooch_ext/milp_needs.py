"""The MILP bound's rows for when maps are needed and how copies queue (milp_bound.py).

Three things a plan's simulated time obeys that the program's first rows (milp_rows.py)
left out, each found by simulating the program's own plan and finding where it stalled:

* the swap-out queue (``queue_rows``): the runtime issues swap-outs after their producers
  on one stream, so a map's swap-out is done only once every swapped map made before it is,
  and its swap-in starts after that;
* recompute chains (``source_rows``): rebuilding a map reads its sources, so a source is
  needed where its recomputed readers are, earlier than its own first need; it is on the
  device from there and, if swapped, is copied in by then;
* whole maps (``prefetch_rows``): a swap-in cannot be split around a memory peak, so a
  map either is on the device during the op at the peak or is all copied in after it.

Columns follow ``Layout``; every gate is a lower bound that the true classes satisfy, so
the program stays a relaxation (experiments/bound_check.py checks it against the exact
optimum).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pooch_ext.sim.model import RECOMPUTE, SWAP, SimModel

Rows = list[tuple[dict[int, float], float]]     # ({column: coefficient}, bound)
Lowered = dict[int, list[tuple[int, int, int]]]  # map: (boundary e, P_e column, N_e column)

PATH_DEPTH = 4          # readers in a row that the rebuild paths follow
PREFETCH_WINDOW = 8     # boundaries before a map's earliest need searched for its peaks
PREFETCH_PEAKS = 2      # the highest of them, where its swap-in is whole
NEED_WINDOW = 12        # the later needs each copy row reaches (milp_rows, shared peaks)


@dataclass(frozen=True)
class Layout:
    """Where each kind of column starts: keep, swap and recompute per map (binary), the
    iteration time T, compute's arrival at each backward boundary (``A + b``, b >= n_fwd),
    each forward op's start (``F + b``), the swap-out queue's progress at each swappable
    map (``D + k``, in queue order), then the gates the rows add (from ``free``)."""

    m: int
    T: int
    A: int
    F: int
    D: int
    free: int

    @classmethod
    def of(cls, model: SimModel) -> Layout:
        m, n, n_fwd = model.m, model.n, model.n_fwd
        T = 3 * m
        F = T + 1 + (n + 1 - n_fwd)
        D = F + n_fwd
        return cls(m, T, T + 1 - n_fwd, F, D, D + int(model.can[:, SWAP].sum()))


def reached(model: SimModel) -> np.ndarray:
    """Compute's arrival at each boundary with no stall: the ops' seconds summed."""
    return np.concatenate([[0.0], np.cumsum(model.dur)])


def queue_order(model: SimModel) -> np.ndarray:
    """The swappable maps in swap-out queue order: producer, then index (sim/engine.py)."""
    swappable = np.flatnonzero(model.can[:, SWAP])
    return swappable[np.lexsort((swappable, model.producer[swappable]))]


def queue_limit(model: SimModel) -> float:
    """A time the swap-out queue's progress never needs to exceed: every swap-out after the
    forward pass's end (the big M of the gated rows)."""
    return float(reached(model)[model.n_fwd] + model.so_s[model.can[:, SWAP]].sum())


def queue_rows(model: SimModel, at: Layout) -> Rows:
    """D_k >= D_(k-1) + so_k x_k and D_k >= (k's producer's end + so_k) x_k: the queue's
    progress at k (the later of its engine's time and compute's there, which never
    decreases); a swapped map's swap-out is done at D_k. Then, for swapped k, the swappable
    maps queued from k on and needed by k's first need q are all copied in after D_k, one
    at a time, before op q starts (unless k is not swapped: big M; rows for later needs
    too tightened no bound we measured and slowed the solver several times over)."""
    m, A, D = at.m, at.A, at.D
    order = queue_order(model)
    ends = reached(model)[model.producer[order] + 1]
    limit = queue_limit(model)
    rows: Rows = []
    for k, i in enumerate(order.tolist()):
        so = float(model.so_s[i])
        rows.append(({D + k: 1.0, m + i: -(float(ends[k]) + so)}, 0.0))
        if k:
            rows.append(({D + k: 1.0, D + k - 1: -1.0, m + i: -so}, 0.0))
    needs = model.bwd_first
    for k, i in enumerate(order.tolist()):
        later, q = order[k:], int(needs[i])
        big = limit + float(model.si_s[later].sum())
        cols = {m + int(j): -float(model.si_s[j]) for j in later[needs[later] <= q]}
        cols[m + i] = cols.get(m + i, 0.0) - big
        cols[A + q + 1], cols[D + k] = 1.0, -1.0
        rows.append((cols, float(model.dur[q]) - big))
    return rows


def rebuild_paths(model: SimModel, depth: int = PATH_DEPTH) -> list[tuple[int, tuple[int, ...]]]:
    """(source s, readers y1..yk): y1 reads s, each next one reads the one before, all may
    be recomputed, and yk's first backward need comes before the needs of s and of the
    shorter paths: with the readers all recomputed, y1 is rebuilt there at the latest."""
    readers: list[list[int]] = [[] for _ in range(model.m)]
    for y in np.flatnonzero(model.can[:, RECOMPUTE]).tolist():
        for src in model.src_fm[y]:
            readers[src].append(y)
    out: list[tuple[int, tuple[int, ...]]] = []

    def extend(s: int, path: tuple[int, ...], lowest: int) -> None:
        for y in readers[path[-1]]:
            if model.bwd_first[y] < lowest:
                out.append((s, path[1:] + (y,)))
            if len(path) < depth:
                extend(s, path + (y,), min(lowest, int(model.bwd_first[y])))
    for s in range(model.m):
        extend(s, (s,), int(model.bwd_first[s]))
    return [(s, path) for s, path in out if model.bwd_first[path[-1]] < model.n]


Gates = list[tuple[int, int, tuple[int, ...]]]     # (column, source, its readers)


def source_rows(model: SimModel, at: Layout, memory: Rows,
                first_col: int) -> tuple[Rows, int, Lowered, Gates]:
    """Recompute chains: per rebuild path a gate g >= r_y1 + .. + r_yk - (k - 1) (its
    readers all recomputed); per source s and path end e (ascending), P_e >= g - k_s (on the
    device from e, though not kept) and, where s can be swapped, x_s >= N_e >= g + x_s - 1
    (swapped and needed by e), each at least the one before and P_e >= N_e. The memory rows
    gain P (in place); op e waits for s's swap-in and for the swap-out queue up to s.
    Returns the rows, the next free column, per source (e, P_e, N_e) (N_e -1 where s
    cannot be swapped), and the gates' columns with their paths."""
    m, A = at.m, at.A
    at_reach = reached(model)
    positions = {int(i): k for k, i in enumerate(queue_order(model).tolist())}
    limit = queue_limit(model)
    rows: Rows = []
    col = first_col
    gates: dict[int, list[tuple[int, int]]] = {}
    paths: Gates = []
    for s, path in rebuild_paths(model):
        rows.append(({col: 1.0, **{2 * m + y: -1.0 for y in path}}, -(len(path) - 1.0)))
        gates.setdefault(s, []).append((int(model.bwd_first[path[-1]]), col))
        paths.append((col, s, path))
        col += 1
    lowered: Lowered = {}
    for s, ends in gates.items():
        ends.sort()
        swappable, own = bool(model.can[s, SWAP]), int(model.bwd_first[s])
        ready = max(at_reach[model.n_fwd], at_reach[model.producer[s] + 1] + model.so_s[s]) \
            + model.si_s[s]
        big = limit + float(model.si_s[s])
        lowered[s] = []
        for j, (e, g) in enumerate(ends):
            presence, needed = col, (col + 1 if swappable else -1)
            col += 2 if swappable else 1
            rows.append(({presence: 1.0, g: -1.0, s: 1.0}, 0.0))
            if swappable:
                rows += [({needed: 1.0, g: -1.0, m + s: -1.0}, -1.0),
                         ({m + s: 1.0, needed: -1.0}, 0.0),
                         ({presence: 1.0, needed: -1.0}, 0.0),
                         ({A + e + 1: 1.0, needed: -float(ready)}, float(model.dur[e])),
                         ({A + e + 1: 1.0, at.D + positions[s]: -1.0, needed: -big},
                          float(model.dur[e] + model.si_s[s]) - big)]
            if lowered[s]:
                _, before, needed_before = lowered[s][-1]
                rows.append(({presence: 1.0, before: -1.0}, 0.0))
                if swappable:
                    rows.append(({needed: 1.0, needed_before: -1.0}, 0.0))
            stop = ends[j + 1][0] if j + 1 < len(ends) else own
            for b in range(e, min(stop, own)):
                memory[b][0][presence] = float(model.nbytes[s])
            lowered[s].append((e, presence, needed))
    return rows, col, lowered, paths


def exact_gate_rows(model: SimModel, lowered: Lowered, gates: Gates) -> Rows:
    """The gates of ``source_rows`` from above: each at most every recompute of its path,
    and P_e and N_e at most the gates of paths ending by e (P_e also at most "not kept").
    ``source_rows`` bounds them only from below, which leaves the solver free to raise them,
    fractionally, where a row holds them with a favourable sign: N at the earlier boundary
    of a copy row counts a map as partly needed, and so partly on the device, at a memory
    peak it cannot be whole at (ResNet-50 b512 pcie3 at 0.3 of the in-core need: the bound
    1765.2 ms without these rows, 1796.2 with). With them each of the three is exact for
    integral classes: the AND of its path, then the OR of the paths by e."""
    m = model.m
    rows: Rows = []
    ends: dict[int, list[tuple[int, int]]] = {}
    for col, s, path in gates:
        rows += [({2 * m + y: 1.0, col: -1.0}, 0.0) for y in path]
        ends.setdefault(s, []).append((int(model.bwd_first[path[-1]]), col))
    for s, segments in lowered.items():
        for e, presence, needed in segments:
            by_e = {g: 1.0 for end, g in ends[s] if end <= e}
            rows += [({**by_e, presence: -1.0}, 0.0), ({presence: -1.0, s: -1.0}, -1.0)]
            if needed >= 0:
                rows.append(({**by_e, needed: -1.0}, 0.0))
    return rows


def need_points(model: SimModel, lowered: Lowered, i: int) -> list[int]:
    """The boundaries where map i, if swapped, may first be needed: its own first backward
    need and the ends of the recompute chains that read it (ascending)."""
    return sorted({e for e, _, n_col in lowered.get(i, ()) if n_col >= 0}
                  | {int(model.bwd_first[i])})


def needed_by(model: SimModel, lowered: Lowered, i: int, b: int) -> dict[int, float]:
    """Map i swapped and first needed by boundary b, as columns (none where it cannot be)."""
    if b >= model.bwd_first[i]:
        return {model.m + i: 1.0}
    cols = [n_col for e, _, n_col in lowered.get(i, ()) if e <= b and n_col >= 0]
    return {cols[-1]: 1.0} if cols else {}


def prefetch_rows(model: SimModel, at: Layout, memory: Rows, lowered: Lowered,
                  first_col: int, top: np.ndarray) -> tuple[Rows, list[tuple[int, int, int]], int]:
    """Whole swap-ins: o(s, q) = 1 (binary, o <= x_s - N_q) where swapped map s, needed
    after backward boundary q, is on the device during op q; memory at q holds it (added to
    ``memory`` in place); otherwise all of its swap-in runs after op q and before the op
    that needs it. Only at the ``PREFETCH_PEAKS`` highest boundaries (fewest maps kept)
    within ``PREFETCH_WINDOW`` of its earliest need (``top``: the tightest level with no
    map kept, milp_rows.all_swapped): each binary costs solver time. Returns the rows, the
    binaries as (column, map, boundary) and the next free column."""
    m, A = at.m, at.A
    rows: Rows = []
    binaries: list[tuple[int, int, int]] = []
    col = first_col
    for s in np.flatnonzero(model.can[:, SWAP]).tolist():
        own = int(model.bwd_first[s])
        needs = need_points(model, lowered, s)
        si = float(model.si_s[s])
        window = np.arange(max(model.n_fwd, needs[0] - PREFETCH_WINDOW), own)
        for q in sorted(window[np.argsort(-top[window], kind="stable")[:PREFETCH_PEAKS]]):
            o = col
            col += 1
            binaries.append((o, s, int(q)))
            by_q = needed_by(model, lowered, s, int(q))
            rows.append((add_scaled({m + s: 1.0, o: -1.0}, by_q, -1.0), 0.0))
            for q2 in [e for e in needs if e > q]:
                cols = add_scaled({A + q2 + 1: 1.0, A + int(q) + 1: -1.0, o: si},
                            needed_by(model, lowered, s, q2), -si)
                rows.append((add_scaled(cols, by_q, si), float(model.dur[q2])))
            memory[q][0][o] = float(model.nbytes[s])
    return rows, binaries, col


def shared_peak_rows(model: SimModel, at: Layout, lowered: Lowered,
                     binaries: list[tuple[int, int, int]]) -> Rows:
    """Whole swap-ins that share a peak q (``prefetch_rows``' binaries): those not on the
    device during op q all run after it, one at a time on the H2D engine, so for each later
    need e (of any of them, the first ``NEED_WINDOW``) op e starts no earlier than op q's
    end plus the swap-ins of all of them needed by e. ``prefetch_rows`` has this row for
    each map alone, and the copy rows (milp_rows.copy_memory_rows) for bytes in fluid
    amounts: a map too big for the room at q and one that fits could share the engine's
    time after q as if each were partly on the device (ResNet-50 b512 pcie3 at 0.3 of the
    in-core need: the bound 1796.2 ms without these rows, 1806.6 with)."""
    A = at.A
    at_peak: dict[int, list[tuple[int, int]]] = {}
    for o, s, q in binaries:
        at_peak.setdefault(q, []).append((o, s))
    rows: Rows = []
    for q, whole in sorted(at_peak.items()):
        if len(whole) < 2:
            continue
        needs = {e for _, s in whole for e in need_points(model, lowered, s) if e > q}
        for e in sorted(needs)[:NEED_WINDOW]:
            cols = {A + e + 1: 1.0, A + q + 1: -1.0}
            for o, s in whole:
                si = float(model.si_s[s])
                add_scaled(cols, needed_by(model, lowered, s, e), -si)
                add_scaled(cols, needed_by(model, lowered, s, q), si)
                cols[o] = cols.get(o, 0.0) + si
            rows.append((cols, float(model.dur[e])))
    return rows


def add_scaled(cols: dict[int, float], more: dict[int, float],
               scale: float = 1.0) -> dict[int, float]:
    """``cols`` plus ``scale`` times ``more`` (in place; returned)."""
    for c, v in more.items():
        cols[c] = cols.get(c, 0.0) + scale * v
    return cols
