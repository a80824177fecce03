"""The memory rule: what occupies device memory between which op boundaries. Every
prediction of device memory (the engine, the static bounds the policies search with, the
keep/swap step's room, the schedule checker) applies the functions here.

Boundary b lies between op b-1 and op b (0..n). The level at a boundary is the bytes held
there, after the boundary's actions; the top of op b is the level at b plus the most op b
holds above it while it runs (its temporaries, or a recompute's chain run at b).

1. Resident bytes (parameters, gradients, optimizer state) are there throughout.
2. Every memory event of the profile whose tensor is not a feature map stays where the
   profile put it: an op's net change moves the level from its boundary to the next, and its
   internal high point is the op's ``peak_inc`` (``base_profile_levels``).
3. A feature map is allocated where its producer allocated it; every later drop of it, and
   every return (swap-in, recompute), is a schedule action at a boundary. So a map occupies
   its bytes over half-open boundary intervals [start, end) (``occupy``), and a plan's level
   is the level with every map alive from its producer on, less what the actions take away.
4. A recompute at boundary b needs the extra memory of its chain while it runs, beside what
   a measured profile says is held between ops there and the level lacks (``held_between_ops``:
   Chainer's backward loop keeps an op's inputs and gradients until the next op starts): the
   op's top is the level plus the larger of the op's own peak and that extra (``tops``).

The host side (swapped maps' host copies) has its own, simpler rule: ``model.host_level``.
The profile's in-core curve (``Profile.memory_curve``, written by ``builder``) is rule 2 with
the feature-map frees in place, the plan that keeps every map.
"""
from __future__ import annotations

import numpy as np


def base_profile_levels(resident_bytes: int, op_of: np.ndarray, signed: np.ndarray,
                        n: int) -> tuple[np.ndarray, np.ndarray]:
    """Rule 2: ``(base_level, peak_inc)`` from the profile's events (op of each, signed
    bytes, in event order) with the feature maps' frees left out: the level at each of the
    n+1 boundaries with every map alive, and each op's high point above its starting level."""
    delta = np.zeros(n + 1, np.int64)
    peak_inc = np.zeros(n + 1, np.int64)
    if len(signed):
        starts = np.flatnonzero(np.r_[True, op_of[1:] != op_of[:-1]])
        ends = np.r_[starts[1:], len(op_of)]
        for a, z in zip(starts, ends):
            prefix = np.cumsum(signed[a:z])
            delta[op_of[a]] = prefix[-1]
            peak_inc[op_of[a]] = max(0, int(prefix.max()))
    return resident_bytes + np.r_[0, np.cumsum(delta[:n])], peak_inc


def levels_from_changes(base_level: np.ndarray, change: np.ndarray) -> np.ndarray:
    """Rule 3 in bulk: ``change[b]`` bytes taken (negative) or given back (positive) at
    boundary b hold from b on; the level at every boundary."""
    return base_level + np.cumsum(change)[: len(base_level)]


def occupy(levels: np.ndarray, start: int, end: int, nbytes: int) -> None:
    """Rule 3 one interval at a time, in place: ``nbytes`` held over boundaries [start, end)
    (negative: taken away). The engine's boundary loop does the same slice arithmetic
    inline (``top[b:end] -= nbytes``), since it runs it thousands of times per search."""
    levels[start:end] += nbytes


def tops(level: np.ndarray, peak_inc: np.ndarray, extra: np.ndarray) -> np.ndarray:
    """Rule 4: the top of each op, its level plus the larger of its own high point and the
    extra memory of a recompute run there."""
    return level + np.maximum(peak_inc, extra)
