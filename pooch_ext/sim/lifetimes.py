"""A plan's lifetimes: for given classes, where each feature map is needed in backward,
where a recompute rebuilds it, and when it is dropped for good; with them its static memory
(``static_top``) and where compute waits for swap-ins (``swap_wait_pairs``).

Feasibility under a budget follows from the lifetimes alone (``static_top`` with
``minimal``), since every dynamic choice of the simulator (when a swap-out is released, when
a swap-in starts) can fall back to the tightest one. A search asks for them thousands of
times: everything but the classes depends on the recompute set alone, so it is made once per
set (``lifetimes``), in C where walk.c loads (sim/clib.py), else by the Python reference
``_rebuilt_parts_python``; the two are equal (tests/test_fastwalk.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pooch_ext.sim.clib import for_model
from pooch_ext.sim.memory import levels_from_changes, tops
from pooch_ext.sim.model import RECOMPUTE, SWAP, SimModel, per_search

@dataclass
class Lifetimes:
    """The static part of a classification: needs, recompute points, final drops."""

    codes: np.ndarray           # (m,) KEEP / SWAP / RECOMPUTE
    reads: np.ndarray           # source * (n + 2) + point for each recompute point that reads
                                # a map as a source (repeats allowed; its other needs: the
                                # model's bwd_need)
    first: np.ndarray           # (m,) first backward need
    end: np.ndarray             # (m,) boundary where it is dropped for good
    rc_point: np.ndarray        # (m,) boundary where a recompute-class map is rebuilt, else -1
    extra: np.ndarray           # (n+1,) most a recompute chain run there holds beyond its map
    addresses: tuple[int, ...]  # of first, end, rc_point and extra (what walk.c reads)


# a search's lifetimes kept by recompute set (``lifetimes``); enough for a refinement's
# distinct sets on the paper's networks (1-3 thousand), bounded for deep ones. What is kept
# is arrays, ints and tuples (one dict per set): a list per grown need, kept as many times,
# made the garbage collector's full collections cost 10% of ResNet-50's search
REBUILT_MEMO = 4096


def lifetimes(model: SimModel, codes: np.ndarray) -> Lifetimes:
    """Needs including recompute sources: recomputing Y at its first need reads its sources
    (``reads``), so they live until then. Everything but ``codes`` depends on the
    recompute set alone, so within ``search_memo`` it is made once per set (a search tries
    many keep / swap changes on one set) and shared, read-only, as is the last answer."""
    key, memo = codes.tobytes(), model.memo
    if memo is not None and memo.get("lifetimes", (None,))[0] == key:
        return memo["lifetimes"][1]
    rebuilt = codes == RECOMPUTE
    by_set = per_search(model, "rebuilt", dict)     # outside a search: a throwaway dict
    set_key = rebuilt.tobytes()
    parts = by_set.get(set_key)
    if parts is None:
        parts = _rebuilt_parts(model, np.flatnonzero(rebuilt))
        if len(by_set) >= REBUILT_MEMO:
            by_set.pop(next(iter(by_set)))      # the oldest
        by_set[set_key] = parts
    frozen = codes.copy()
    frozen.flags.writeable = False
    life = Lifetimes(frozen, *parts)
    if memo is not None:
        memo["lifetimes"] = (key, life)
    return life


def _rebuilt_parts(model: SimModel, rebuilt: np.ndarray) -> tuple:
    """``Lifetimes``' fields after ``codes`` for the recompute set ``rebuilt`` (indices,
    ascending), read-only: walk.c's where it loads, else the Python reference's."""
    lib = for_model(model)
    parts = (_rebuilt_parts_python(model, rebuilt) if lib is None
             else _rebuilt_parts_c(lib, model, rebuilt))
    for array in parts[:-1]:
        array.flags.writeable = False
    return parts


def _rebuilt_parts_python(model: SimModel, rebuilt: np.ndarray) -> tuple:
    """The rule, one rebuilt map at a time, descendants first (sources have smaller ids), so
    every point that reads a map is known when it is reached: a map is rebuilt at its first
    need or where a recompute reads it, whichever comes first; each of its sources then lives
    from that point (if earlier than its own first need) to past it (if later than its end)."""
    first0, end0 = per_search(model, "needs_as_lists", lambda: (model.bwd_first.tolist(),
                                                               model.bwd_end.tolist()))
    stride = model.n + 2
    points: dict[int, int] = {}
    min_read: dict[int, int] = {}
    keys: list[int] = []
    lowered: dict[int, int] = {}
    ended: dict[int, int] = {}
    src_fm = model.src_fm
    for i in rebuilt[::-1].tolist():
        point = min(first0[i], min_read.get(i, first0[i]))
        points[i] = point
        for s in src_fm[i]:
            if point < min_read.get(s, point + 1):
                min_read[s] = point
            if point < lowered.get(s, first0[s]):
                lowered[s] = point
            if point + 1 > ended.get(s, end0[s]):
                ended[s] = point + 1
            keys.append(s * stride + point)
    first, end = model.bwd_first.copy(), model.bwd_end.copy()
    rc_point = np.full(model.m, -1, np.int64)
    for array, changes in ((first, lowered), (end, ended), (rc_point, points)):
        if changes:
            array[list(changes)] = list(changes.values())
    extra = np.zeros(model.n + 1, np.int64)
    if len(rebuilt):
        run_at = rc_point[rebuilt]
        np.maximum.at(extra, run_at, model.rc_extra[rebuilt] + model.between[run_at])
    return (np.asarray(keys, np.int64), first, end, rc_point, extra,
            tuple(a.ctypes.data for a in (first, end, rc_point, extra)))


def _rebuilt_parts_c(lib: Any, model: SimModel, rebuilt: np.ndarray) -> tuple:
    """``_rebuilt_parts_python`` in walk.c (``rebuilt_parts``). Its outputs are views of one
    buffer, which starts as a copy of ``_CInputs.start``: NumPy calls and ctypes' argument
    conversions, not the C, are most of the cost."""
    c: _CInputs = per_search(model, "rebuilt parts in C", lambda: _CInputs(model))
    m, n1 = model.m, model.n + 1
    rebuilt = np.ascontiguousarray(rebuilt, np.int64)
    buffer = np.empty(len(c.start) + int(c.src_count[rebuilt].sum()), np.int64)
    buffer[:len(c.start)] = c.start
    at = buffer.ctypes.data
    count = lib.rebuilt_parts(len(rebuilt), rebuilt.ctypes.data, *c.addresses, model.n + 2,
                              at, at + 8 * m, at + 16 * m, at + 24 * m, at + 32 * m,
                              at + 8 * (4 * m + n1))
    first, end, rc_point, extra = (buffer[:m], buffer[m:2 * m], buffer[2 * m:3 * m],
                                   buffer[4 * m:4 * m + n1])
    return (buffer[4 * m + n1:4 * m + n1 + count], first, end, rc_point, extra,
            (at, at + 8 * m, at + 16 * m, at + 32 * m))


class _CInputs:
    """What walk.c's ``rebuilt_parts`` and ``static_top`` read of ``model`` (contiguous int64,
    with their addresses): the recompute sources as offsets and indices, first needs, chain
    extras, bytes held between ops; last forward uses, bytes, base level, peak inside each
    op; and ``rebuilt_parts``' outputs' starting values: first and last needs, no recompute
    point, no read, no extra."""

    def __init__(self, model: SimModel) -> None:
        m = model.m
        self.src_count = np.asarray([len(s) for s in model.src_fm], np.int64)
        src_ptr = np.zeros(m + 1, np.int64)
        np.cumsum(self.src_count, out=src_ptr[1:])
        src_idx = np.asarray([s for srcs in model.src_fm for s in srcs], np.int64)
        self.arrays = (src_ptr, src_idx, *(np.ascontiguousarray(a, np.int64) for a in (
            model.bwd_first, model.rc_extra, model.between)))
        self.addresses = [a.ctypes.data for a in self.arrays]
        self.static = [np.ascontiguousarray(a, np.int64) for a in (
            model.last_fwd, model.nbytes, model.base_level, model.peak_inc)]
        self.static_addresses = [a.ctypes.data for a in self.static[:3]]
        self.peak_inc_at = self.static[3].ctypes.data
        self.start = np.concatenate((model.bwd_first, model.bwd_end, np.full(m, -1),
                                     np.full(m, np.iinfo(np.int64).max),
                                     np.zeros(model.n + 1)), dtype=np.int64, casting="unsafe")


def swap_waits(model: SimModel, life: Lifetimes) -> tuple[dict[int, list[int]], dict]:
    """``swap_wait_pairs`` as {boundary: maps}, each list in map order (the Python walk's)."""
    as_source: dict[int, list[int]] = {}
    as_need: dict[int, list[int]] = {}
    for at, (maps, boundaries) in zip((as_source, as_need), swap_wait_pairs(model, life)):
        for i, b in zip(maps.tolist(), boundaries.tolist()):
            at.setdefault(b, []).append(i)
    return as_source, as_need


def swap_wait_pairs(model: SimModel, life: Lifetimes) -> tuple[tuple[np.ndarray, np.ndarray],
                                                                tuple[np.ndarray, np.ndarray]]:
    """Where compute waits for the swap-in of each swapped map, as (maps, boundaries) in map
    order: first where a recompute reads it as a source (the wait comes before the recompute,
    also where the op there needs the map itself too), then where only an op needs it (after
    any recompute there)."""
    own_map, own_b, own_key = per_search(model, "own_waits", lambda: _own_needs(model))
    swapped, stride = life.codes == SWAP, model.n + 2
    key = np.unique(life.reads[swapped[life.reads // stride]])      # by map, then boundary
    by_op = swapped[own_map]
    if len(key):                # an op's need where the map is read as a source waits there
        at = np.minimum(np.searchsorted(own_key, key), len(own_key) - 1)
        by_op[at[own_key[at] == key]] = False
    return (key // stride, key % stride), (own_map[by_op], own_b[by_op])


def _own_needs(model: SimModel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each map's own backward needs (map, boundary), by map then boundary; a key of each."""
    needs = [sorted(set(b)) for b in model.bwd_need]
    own_map = np.asarray([i for i, b in enumerate(needs) for _ in b], np.int64)
    own_b = np.asarray([k for b in needs for k in b], np.int64)
    return own_map, own_b, own_map * (model.n + 2) + own_b


def static_top(model: SimModel, life: Lifetimes, minimal: bool,
               peak_inc: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(level, top) per boundary from the static lifetimes; top = level + peak inside the op
    (``peak_inc``: each op's, default the model's, its smallest configuration's). In walk.c
    where it loads (the searches ask this of every trial), else in NumPy.

    ``minimal``: swapped maps are absent from the boundary after their last forward use until
    their first backward need (the tightest any schedule can do); otherwise they are counted
    alive until their final drop (the simulator then subtracts releases and adds swap-ins).
    """
    peak_inc = model.peak_inc if peak_inc is None else peak_inc
    lib = for_model(model)
    if lib is None:
        return _static_top_numpy(model, life, minimal, peak_inc)
    c: _CInputs = per_search(model, "rebuilt parts in C", lambda: _CInputs(model))
    n = model.n
    out = np.zeros(3 * n + 4, np.int64)         # diff (n + 2), level, top
    at = out.ctypes.data
    peak_at = (c.peak_inc_at if peak_inc is model.peak_inc
               else np.ascontiguousarray(peak_inc, np.int64).ctypes.data)
    lib.static_top(n, model.m, life.codes.ctypes.data, *life.addresses, *c.static_addresses,
                   peak_at, int(minimal), at, at + 8 * (n + 2), at + 8 * (2 * n + 3))
    return out[n + 2:2 * n + 3], out[2 * n + 3:]


def _static_top_numpy(model: SimModel, life: Lifetimes, minimal: bool,
                      peak_inc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``static_top`` with sim/memory.py's functions, the reference walk.c's equals."""
    diff = np.zeros(model.n + 2, np.int64)
    codes, nb = life.codes, model.nbytes
    np.add.at(diff, life.end, -nb)
    hole = (codes == RECOMPUTE) | ((codes == SWAP) & minimal)
    hole_start = model.last_fwd[hole] + 1
    hole_end = np.where(codes[hole] == RECOMPUTE, life.rc_point[hole], life.first[hole])
    np.add.at(diff, hole_start, -nb[hole])
    np.add.at(diff, hole_end, nb[hole])
    level = levels_from_changes(model.base_level, diff)
    return level, tops(level, peak_inc, life.extra)
