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
