"""Offsets for an iteration's device blocks inside one arena, planned from their lifetimes.

Why: CuPy's pool places each request in the smallest free chunk that fits and splits it, so
its total (what ``MemoryPool.set_limit`` bounds) runs above the bytes held: on the H200 demo's
log one iteration held 47.1 MiB at most and the pool took 67.3 MiB (``pooch_ext/cupy_pool``).
Under a plan every iteration asks for the same blocks in the same order, so their places can
be planned once, as static memory planners do ("greedy by size": the largest block first,
each at the lowest offset free over its whole lifetime). The extent this gives is what an
arena allocator needs: hooks/arena.py (opt-in) places the CuPy device's blocks so.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from pooch_ext.cupy_pool import round_size


@dataclass(frozen=True)
class Block:
    """One allocation: bytes, and the event indices it lives in, ``[start, end)``."""

    nbytes: int
    start: int
    end: int


def peak_held(blocks: list[Block]) -> int:
    """The most bytes (rounded as the pool rounds them) live at once: no placement needs
    less."""
    changes: dict[int, int] = {}
    for block in blocks:
        size = round_size(block.nbytes)
        changes[block.start] = changes.get(block.start, 0) + size
        changes[block.end] = changes.get(block.end, 0) - size
    live = best = 0
    for index in sorted(changes):
        live += changes[index]
        best = max(best, live)
    return best


def plan_offsets(blocks: list[Block]) -> tuple[list[int], int]:
    """(offset of each block, the arena's extent): largest first, each at the lowest offset
    where it overlaps no placed block that is live at the same time."""
    order = sorted(range(len(blocks)), key=lambda k: (-round_size(blocks[k].nbytes),
                                                      blocks[k].start))
    offsets = [0] * len(blocks)
    placed: list[tuple[int, int, int, int]] = []      # (offset, end offset, start, end)
    extent = 0
    for k in order:
        block, size = blocks[k], round_size(blocks[k].nbytes)
        taken = sorted((low, high) for low, high, start, end in placed
                       if start < block.end and block.start < end)
        offset = 0
        for low, high in taken:
            if offset + size <= low:
                break
            offset = max(offset, high)
        offsets[k] = offset
        placed.append((offset, offset + size, block.start, block.end))
        extent = max(extent, offset + size)
    return offsets, extent


def best_fit_extent(events: list[tuple]) -> int:
    """The extent one region needs when each request, as it comes (``("malloc", bytes, key)``
    and ``("free", bytes, key)`` in order), takes the smallest free gap that holds it, else
    the top, and a freed block merges with its free neighbours: an allocator that knows
    nothing of the future but never splits memory between separate blocks, as CuPy's pool
    does between its cudaMalloc'd ones (what an arena could do in profiled iterations)."""
    gaps: list[tuple[int, int]] = []        # (offset, size), sorted by offset, merged
    placed: dict = {}                       # key -> (offset, size)
    top = extent = 0
    for kind, nbytes, key in events:
        if kind == "malloc":
            size = round_size(nbytes)
            fits = [k for k, (_, room) in enumerate(gaps) if room >= size]
            if fits:
                k = min(fits, key=lambda j: (gaps[j][1], gaps[j][0]))
                offset, room = gaps[k]
                gaps[k:k + 1] = [(offset + size, room - size)] if room > size else []
            else:                           # (no gap ever ends at the top: see free)
                offset, top = top, top + size
            placed[key] = (offset, size)
            extent = max(extent, top)
        elif key in placed:
            offset, size = placed.pop(key)
            at = bisect.bisect_left(gaps, (offset, 0))
            if at < len(gaps) and offset + size == gaps[at][0]:      # merge the next one
                size += gaps.pop(at)[1]
            if at and gaps[at - 1][0] + gaps[at - 1][1] == offset:   # and the previous
                offset, size = gaps[at - 1][0], gaps[at - 1][1] + size
                at -= 1
                gaps.pop(at)
            if offset + size == top:                                 # back to the top
                top = offset
            else:
                gaps.insert(at, (offset, size))
    return extent
