"""Budget-free simulation of many one-map variants of a classification at once.

PoocH's recompute step (paper 4.4.3) needs, every round, the iteration time of the current
classes with each candidate map switched to keep and to recompute, the budget ignored: about
2|L| simulations per round, |L| rounds. Without a budget the timeline is simple enough to run
all variants side by side as numpy vectors: forward compute never stalls, so op end times are
a cumulative sum and the swap-out copies a max-plus scan; the backward walk is one loop over
the backward boundaries with one vector entry per variant. The result equals
``engine.run(model, codes, "early", math.inf).time_s`` for each variant (tested).
"""
from __future__ import annotations

import numpy as np

from pooch_ext.sim.lifetimes import Lifetimes, lifetimes, swap_waits
from pooch_ext.sim.model import KEEP, RECOMPUTE, SWAP, SimModel
from pooch_ext.sim.engine import EPS  # the same tolerance, or the times would differ


def _variant_needs(model: SimModel, life: Lifetimes, codes: np.ndarray, x: int
                   ) -> tuple[dict[int, int], list[tuple[int, int]]]:
    """Switching swapped map ``x`` to recompute: new recompute points and added needs.

    x is rebuilt at its first need; its sources gain that need point; a recompute-class
    source whose rebuild thereby moves earlier passes the earlier point on to its sources.
    Returns ({map: new rc point}, [(map, added need boundary)]).
    """
    rc_points = {x: int(life.first[x])}
    added: list[tuple[int, int]] = []
    work = [x]
    while work:
        y = work.pop()
        point = rc_points[y]
        for s in model.src_fm[y]:
            added.append((s, point))
            if codes[s] == RECOMPUTE:
                current = rc_points.get(s, int(life.rc_point[s]))
                if point < current:
                    rc_points[s] = point
                    work.append(s)
    return rc_points, added


def variant_times(model: SimModel, codes: np.ndarray, changes: list[tuple[int, int]]
                  ) -> np.ndarray:
    """Budget-free iteration time of ``codes`` with each (map, new class) change applied alone.

    Changes go from swap to keep or to recompute (the only moves the recompute step makes).
    """
    # Long on purpose: one vectorised pass over the boundaries that mirrors engine._Run.walk
    # (early timing, no budget) step by step, so the two read side by side; its test demands
    # equal times to the engine's for every variant.
    n, n_fwd, m = model.n, model.n_fwd, model.m
    V = len(changes)
    if V == 0:
        return np.zeros(0)
    life = lifetimes(model, codes)
    rows = np.repeat(codes[None, :], V, axis=0)
    first = np.repeat(life.first[None, :], V, axis=0)
    rc_time = np.zeros((V, n + 1))
    base_rc = np.zeros(n + 1)
    for i in np.flatnonzero(codes == RECOMPUTE):
        base_rc[life.rc_point[i]] += model.rc_s[i]
    rc_time[:] = base_rc
    extra_waits: dict[int, list[tuple[int, int]]] = {}   # boundary -> [(variant, map)]
    for v, (x, new) in enumerate(changes):
        if codes[x] != SWAP or new not in (KEEP, RECOMPUTE):
            raise ValueError("variants must move a swapped map to keep or recompute")
        rows[v, x] = new
        if new == RECOMPUTE:
            rc_points, added = _variant_needs(model, life, codes, x)
            for y, point in rc_points.items():
                if y != x:
                    rc_time[v, life.rc_point[y]] -= model.rc_s[y]
                rc_time[v, point] += model.rc_s[y]
            for s, point in added:
                if rows[v, s] == SWAP:
                    first[v, s] = min(first[v, s], point)
                    extra_waits.setdefault(point, []).append((v, s))

    swapped = rows == SWAP
    # forward: no stalls without a budget; swap-outs start when their producer ends
    fwd_end = np.cumsum(model.dur[:n_fwd]) if n_fwd else np.zeros(0)
    issue = np.where(swapped, fwd_end[model.producer][None, :], -np.inf)
    so = np.where(swapped, model.so_s[None, :], 0.0)
    csum = np.cumsum(so, axis=1)
    so_done = csum + np.maximum.accumulate(issue - (csum - so), axis=1)
    so_done = np.where(swapped, so_done, np.inf)

    # swap-in queue of each variant: swapped maps by (first need, id)
    key = np.where(swapped, first * (m + 1) + np.arange(m)[None, :], np.iinfo(np.int64).max)
    queue = np.argsort(key, axis=1, kind="stable")
    qlen = swapped.sum(axis=1)
    qpos = np.zeros(V, np.int64)
    si = model.si_s
    si_done = np.full((V, m), -np.inf)
    vidx = np.arange(V)

    base_src, base_op = swap_waits(model, life)
    extra = {b: (np.array([v for v, _ in pairs]), np.array([s for _, s in pairs]))
             for b, pairs in extra_waits.items()}
    src_arr = {b: np.array(v) for b, v in base_src.items()}
    op_arr = {b: np.array(v) for b, v in base_op.items()}

    t = np.full(V, float(fwd_end[-1]) if n_fwd else 0.0)
    h2d_free = np.zeros(V)
    qmax = queue.shape[1] - 1 if m else 0
    for b in range(n_fwd, n):
        # swap-ins: in queue order, when released (or forced at the first need); each round
        # advances qpos (<= qlen) of at least one variant or breaks, so it ends
        while True:
            active = qpos < qlen
            if not active.any():
                break
            head = queue[vidx, np.minimum(qpos, qmax)]
            done_out = so_done[vidx, head]
            forced = active & (first[vidx, head] == b)
            can = active & (forced | (done_out <= t + EPS))
            if not can.any():
                break
            t = np.where(can, np.maximum(t, np.where(forced, done_out, -np.inf)), t)
            start = np.maximum(t, h2d_free)
            done = start + si[head]
            h2d_free = np.where(can, done, h2d_free)
            si_done[vidx[can], head[can]] = done[can]
            qpos += can
        if b in extra:
            variants, slots = extra[b]
            np.maximum.at(t, variants, si_done[variants, slots])
        if b in src_arr:
            t = np.maximum(t, si_done[:, src_arr[b]].max(axis=1))
        t = t + rc_time[:, b]
        if b in op_arr:
            t = np.maximum(t, si_done[:, op_arr[b]].max(axis=1))
        t = t + model.dur[b]
    return t
