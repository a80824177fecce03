"""An arena for the CuPy device: each iteration's blocks at offsets planned from the last one.

Why: CuPy's pool places a request in the smallest free chunk that fits and splits it, so its
total, which the pool's limit (the budget) binds, runs 1.25-1.43x above the bytes an iteration
holds (the demo's H200 log, experiments/gpu/pool_strategies.py). Under a plan every iteration
asks for the same blocks in the same order. Once two iterations in a row asked alike, their
blocks get offsets in one arena block (pooch_ext/placement.py: the bytes held, no more), and
later iterations are served there. A request that differs from the plan, or whose place
still holds a live block (a user kept an array), goes to the pool instead, with the rest of
its iteration: nothing is ever placed over a live block. The plan is kept (an evaluation or a
short batch between planned iterations does not cost it); a new sequence asked twice in a row
is planned anew.

``ArenaPlan`` is the logic (plain Python, tested on the CPU); ``CupyArena`` installs it as
CuPy's allocator. Opt-in (``CupyDevice(arena=True)``, or ``POOCH_GPU_ARENA=1``): not yet run
on a GPU.
"""
from __future__ import annotations

import weakref
from typing import Any

from pooch_ext.placement import Block, plan_offsets, round_up


class ArenaPlan:
    """Learns an iteration's requests and serves the next ones at planned offsets.

    ``request(nbytes)`` returns an offset in the arena, or None (take it from the pool); the
    caller reports each block's end with ``released(token)``. ``new_iteration()`` plans
    from the iteration just ended where it asked as the one before did, unlike the plan."""

    def __init__(self) -> None:
        self.offsets: list[int | None] = []     # per request of a planned iteration
        self.sizes: list[int] = []
        self.extent = 0
        self.serving = False
        self._events = 0
        self._asked: list[int] = []              # this iteration's rounded sizes
        self._spans: dict[int, list[int]] = {}   # token -> [request, start, end event or -1]
        self._tokens = 0                         # unique over iterations: blocks outlive them
        self._last: list[int] | None = None      # the previous iteration's sizes
        self._live: dict[int, tuple[int, int]] = {}   # token -> (offset, end offset)
        self._deviated = False

    def request(self, nbytes: int, serve: bool = True) -> tuple[int, int | None]:
        """(a token for ``released``, the offset to serve it at or None for the pool);
        ``serve`` False: this iteration is only learnt (a profiler counts the pool's blocks)."""
        k, size = len(self._asked), round_up(nbytes)
        self._tokens += 1
        token = self._tokens
        self._asked.append(size)
        self._spans[token] = [k, self._next(), -1]
        offset = None
        self._deviated |= not serve
        if self.serving and not self._deviated:
            if k >= len(self.sizes) or self.sizes[k] != size:
                self._deviated = True               # not the plan's iteration any more
            elif (planned := self.offsets[k]) is not None:
                if any(low < planned + size and planned < high
                       for low, high in self._live.values()):
                    self._deviated = True           # its place still holds a live block
                else:
                    offset = planned
                    self._live[token] = (offset, offset + size)
        return token, offset

    def released(self, token: int) -> None:
        self._live.pop(token, None)
        span = self._spans.get(token)
        if span is not None and span[2] < 0:
            span[2] = self._next()

    def new_iteration(self) -> bool:
        """End the iteration: plan from it where it asked as the one before did and unlike
        the plan; returns whether the next one is offered the arena (once there is a plan)."""
        asked = self._asked
        if asked and asked == self._last and asked != self.sizes:
            ended = [(k, start, end) for k, start, end in self._spans.values() if end >= 0]
            # blocks that outlive the iteration are left to the pool
            offsets, self.extent = plan_offsets([Block(asked[k], start, end)
                                                 for k, start, end in ended])
            placed = {k: offset for (k, _, _), offset in zip(ended, offsets)}
            self.offsets = [placed.get(k) for k in range(len(asked))]
            self.sizes = list(asked)
        # once planned, always offered: an iteration unlike the plan (an evaluation, a short
        # batch) or one that finds a place still held goes to the pool from there on, and
        # the plan is kept; re-planning is quadratic, and only a new sequence asked twice
        # in a row gets it
        self.serving = bool(self.sizes)
        self._last, self._asked, self._spans = asked, [], {}
        self._events, self._deviated = 0, False
        return self.serving

    def _next(self) -> int:
        self._events += 1
        return self._events


class CupyArena:
    """``ArenaPlan`` as CuPy's allocator: arena blocks are views of one pool allocation of the
    plan's extent (counted by the pool and its limit); each view's owner tells the plan when
    CuPy lets go of it. Everything else comes from the pool as before."""

    def __init__(self, cupy: Any, paused: Any = lambda: False) -> None:
        self.cupy, self.paused = cupy, paused    # paused(): while a profiler watches the pool
        self.pool = cupy.get_default_memory_pool()
        self.plan = ArenaPlan()
        self.block: Any = None          # the pool allocation the arena lives in
        self._previous: Any = None
        self.served = self.fallbacks = 0

    def install(self) -> None:
        self._previous = self.cupy.cuda.get_allocator()
        self.cupy.cuda.set_allocator(self.malloc)

    def uninstall(self) -> None:
        if self._previous is not None:
            self.cupy.cuda.set_allocator(self._previous)
            self._previous = None

    def new_iteration(self) -> None:
        """Past the plan's extent (a new plan), a new arena allocation: where the pool cannot
        give it, nothing is served (views of the old one live on with their owners)."""
        if self.plan.new_iteration() and (self.block is None
                                          or self.block.mem.size < self.plan.extent):
            self.block = None
            try:
                self.block = self.pool.malloc(self.plan.extent) if self.plan.extent else None
            except MemoryError:                 # CuPy's OutOfMemoryError: the pool's limit
                self.block = None

    def malloc(self, nbytes: int) -> Any:
        cuda = self.cupy.cuda
        token, offset = self.plan.request(nbytes, serve=self.block is not None
                                          and not self.paused())
        if offset is not None:
            self.served += 1
            owner = _Owner(self.block)          # keeps the arena's allocation alive
            memory = cuda.UnownedMemory(self.block.ptr + offset, nbytes, owner,
                                        self.block.device_id)
        else:
            self.fallbacks += 1
            taken = self.pool.malloc(nbytes)
            owner = _Owner(taken)
            memory = cuda.UnownedMemory(taken.ptr, nbytes, owner, taken.device_id)
        weakref.finalize(owner, self.plan.released, token)
        return cuda.MemoryPointer(memory, 0)


class _Owner:
    """What an arena view or a pool block handed out keeps alive; its end is the block's."""

    __slots__ = ("held", "__weakref__")

    def __init__(self, held: Any) -> None:
        self.held = held
