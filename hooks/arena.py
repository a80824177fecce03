"""An arena for the CuPy device: each iteration's blocks at offsets planned from the last one.

Why: CuPy's pool places a request in the smallest free chunk that fits and splits it, so its
total, which the pool's limit (the budget) binds, runs 1.25-1.43x above the bytes an iteration
holds (the demo's H200 log, experiments/gpu/pool_strategies.py). Under a plan every iteration
asks for the same blocks in the same order. Once two iterations in a row asked alike, their
blocks get offsets in one arena block (pooch_ext/placement.py: the bytes held, no more), and
later iterations are served there.

Each request is served only if it is the plan's request at its place in the iteration (same
size) and its offset holds no live block (a user may keep an array); else it comes from the
pool. Nothing is ever placed over a live block. The plan is kept through iterations unlike it
(an evaluation, a short batch); a new sequence asked twice in a row is planned anew (planning
is quadratic in the blocks). While the device says its work is not the training's (a profiler
reading the pool's hooks, plain Chainer beside PoocH, the runtime's own arrays) the arena
neither learns nor serves, and holds no block.

``ArenaPlan`` is the logic (plain Python, tested on the CPU); ``CupyArena`` installs it as
CuPy's allocator. Opt-in (``CupyDevice(arena=True)``, or ``POOCH_GPU_ARENA=1``): not yet run
on a GPU. One thread, one device, one stream, as the CuPy device computes.
"""
from __future__ import annotations

import bisect
import contextlib
import os
import threading
import weakref
from typing import Any, Callable, Iterator

from pooch_ext.cupy_pool import round_size
from pooch_ext.placement import Block, plan_offsets


class ArenaPlan:
    """Learns an iteration's requests and serves the next ones at planned offsets.

    ``request(nbytes)`` returns an offset in the arena, or None (take it from the pool); the
    caller reports each block's end with ``released(token)``, which may come from a garbage
    collection in the middle of a request. ``new_iteration()`` plans from the iteration just
    ended where it asked as the one before did, unlike the plan."""

    def __init__(self) -> None:
        self.offsets: list[int | None] = []     # per request of a planned iteration
        self.sizes: list[int] = []
        self.extent = 0
        self._events = 0
        self._asked: list[int] = []              # this iteration's rounded sizes
        self._spans: dict[int, list[int]] = {}   # token -> [request, start, end event or -1]
        self._tokens = 0                         # unique over iterations: blocks outlive them
        self._last: list[int] | None = None      # the previous iteration's sizes
        self._live: dict[int, tuple[int, int]] = {}   # token -> (offset, end offset)
        # the same ranges sorted: served only where free, they never overlap, so a request's
        # neighbours settle whether it fits (a walk over every live block was a hot path)
        self._lows: list[int] = []
        self._highs: list[int] = []
        self._ended: list[int] = []              # released, not yet out of _live
        self._lock = threading.Lock()

    @property
    def serving(self) -> bool:
        return bool(self.sizes)

    def request(self, nbytes: int, offer: bool = True) -> tuple[int, int | None]:
        """(a token for ``released``, the offset to serve it at or None for the pool);
        ``offer`` False: learnt, not served (the caller has no block to serve it in)."""
        with self._lock:
            while self._ended:                   # (a finalizer only appends: nothing it
                self._let_go(self._ended.pop())  # does changes the ranges while they are read)
            k, size = len(self._asked), round_size(nbytes)
            self._tokens += 1
            token = self._tokens
            self._asked.append(size)
            self._spans[token] = [k, self._next(), -1]
            planned = self.offsets[k] if k < len(self.sizes) and self.sizes[k] == size else None
            if not offer or planned is None or self._taken(planned, planned + size):
                return token, None
            if size:                             # (an empty view takes no room)
                self._live[token] = (planned, planned + size)
                at = bisect.bisect_left(self._lows, planned)
                self._lows.insert(at, planned)
                self._highs.insert(at, planned + size)
            return token, planned

    def _taken(self, low: int, high: int) -> bool:
        """Whether a live served range starts before ``high`` and ends after ``low``: of
        those starting before ``high``, the last ends last (they do not overlap)."""
        at = bisect.bisect_left(self._lows, high) - 1
        return at >= 0 and self._highs[at] > low

    def _let_go(self, token: int) -> None:
        span = self._live.pop(token, None)
        if span is not None:
            at = bisect.bisect_left(self._lows, span[0])
            del self._lows[at], self._highs[at]

    def released(self, token: int) -> None:
        self._ended.append(token)
        span = self._spans.get(token)
        if span is not None and span[2] < 0:
            span[2] = self._next()

    def new_iteration(self) -> bool:
        """End the iteration; returns whether the next one is offered the arena."""
        with self._lock:
            asked = self._asked
            if asked and asked == self._last and asked != self.sizes:
                ended = [(k, start, end) for k, start, end in list(self._spans.values())
                         if end >= 0]            # blocks that outlive it are left to the pool
                offsets, self.extent = plan_offsets([Block(asked[k], start, end)
                                                     for k, start, end in ended])
                placed = {k: offset for (k, _, _), offset in zip(ended, offsets)}
                self.offsets = [placed.get(k) for k in range(len(asked))]
                self.sizes = list(asked)
            self._last, self._asked, self._spans, self._events = asked, [], {}, 0
            return self.serving

    def _next(self) -> int:
        self._events += 1
        return self._events


class CupyArena:
    """``ArenaPlan`` as CuPy's allocator: arena blocks are views of one pool allocation of the
    plan's extent (counted by the pool and its limit), made on the stream current then and
    served on it only; each view's owner tells the plan when CuPy lets go of it. Everything
    else, and everything aside or while a profiler reads the pool's hooks, comes from the
    pool as before."""

    def __init__(self, cupy: Any, profiling: Callable[[], bool] = lambda: False) -> None:
        self.cupy, self.profiling = cupy, profiling
        self._aside = 0
        self.pool = cupy.get_default_memory_pool()
        self.plan = ArenaPlan()
        self.block: Any = None          # the pool allocation the arena lives in
        self.stream: Any = None         # the stream it was made on
        self._tried = False
        self._previous: Any = None
        self.served = self.fallbacks = 0

    @contextlib.contextmanager
    def aside(self) -> Iterator[None]:
        """Work that is not the training's (plain Chainer beside PoocH, the runtime's own
        arrays): the pool's alone, neither learnt nor served."""
        self._aside += 1
        try:
            yield
        finally:
            self._aside -= 1

    def _away(self) -> bool:
        return self._aside > 0 or self.profiling()

    def install(self) -> None:
        if self._previous is None:
            self._previous = self.cupy.cuda.get_allocator()
            self.cupy.cuda.set_allocator(self.malloc)

    def uninstall(self) -> None:
        """The allocator back; the block and the plan let go (live views keep the block)."""
        if self._previous is not None:
            self.cupy.cuda.set_allocator(self._previous)
            self._previous = None
        self.block, self.plan = None, ArenaPlan()

    def new_iteration(self) -> None:
        """None of the old block where the plan outgrew it or nothing is served (a profile
        must not count it); the next one is made at the iteration's first request."""
        serving, self._tried = self.plan.new_iteration(), False
        if not serving or self._away() or (self.block is not None
                                           and self.block.mem.size < self.plan.extent):
            self.block = None

    def _ensure_block(self) -> None:
        """The arena's allocation, once an iteration at most (a profiled one may have ended
        with none, and the pool may refuse it)."""
        if self.block is not None or self._tried or not self.plan.extent:
            return
        self._tried = True
        try:
            self.block = self.pool.malloc(self.plan.extent)
        except MemoryError:                 # CuPy's OutOfMemoryError: the pool's limit
            return
        self.stream = self.cupy.cuda.get_current_stream().ptr

    def malloc(self, nbytes: int) -> Any:
        cuda = self.cupy.cuda
        if self._away():
            if self.profiling():
                self.block = None               # a profile must not count an idle block
            return self.pool.malloc(nbytes)
        if self.plan.serving:
            self._ensure_block()
        block = self.block
        token, offset = self.plan.request(nbytes, offer=block is not None and
                                          cuda.get_current_stream().ptr == self.stream)
        if offset is not None:
            self.served += 1
            owner = _Owner(block)               # keeps the arena's allocation alive
            memory = cuda.UnownedMemory(block.ptr + offset, nbytes, owner, block.device_id)
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


def arena_for(cupy: Any, wanted: bool | None, profiling: Callable[[], bool]) -> CupyArena | None:
    """The CuPy device's arena where ``wanted`` (None: where ``POOCH_GPU_ARENA=1``)."""
    wanted = os.environ.get("POOCH_GPU_ARENA") == "1" if wanted is None else wanted
    return CupyArena(cupy, profiling) if wanted else None
