"""A pure-Python emulation of CuPy's default device memory pool, one device and one stream.

Why: on a GPU the pool's ``total_bytes`` (what ``MemoryPool.set_limit`` bounds) runs far above
the bytes the arrays hold, because freed chunks are split for smaller requests; replaying a
recorded malloc/free trace here measures that, and whether a limit would have raised, offline.

Followed: CuPy v14.2.0 (commit dc1552a32f5489bdf6a5a721dfd952a92d47d934),
``cupy/cuda/memory.pyx`` ``SingleDeviceMemoryPool`` and ``_Arena`` (same since v14.1.0):

* a request is rounded up to 512 bytes (``_round_size``); a 0-byte request gets a null pointer
  and never touches the pool;
* free chunks sit in one ``std::set`` of ``(size, chunk)`` pairs; ``get_chunk`` takes
  ``lower_bound((size, 0))``: the smallest free chunk at least as large (best fit; v14.0 and
  older had one bin per 512-byte size, the same choice of size). Between chunks of one size
  the set orders by the ``_Chunk`` object's address in the interpreter's heap, which a trace
  does not show: ``tie`` picks a stand-in (see ``TIES``);
* a larger chunk is split: the request keeps the front, the remainder (same cudaMalloc'd
  block, right after it) becomes a new free chunk, inserted without merging;
* ``free`` merges the chunk with a free next neighbour, then with a free previous one (same
  block only), and inserts the result;
* with no free chunk large enough, a new block of exactly the rounded size is cudaMalloc'd
  (``_try_malloc``): if ``limit`` is set and ``total + size > limit`` the pool runs
  ``free_all_blocks`` and checks again (twice, around a ``gc.collect``), then raises
  OutOfMemoryError; a request larger than the limit raises at once;
* ``free_all_blocks`` returns only free chunks that are a whole block (no prev, no next);
* ``used_bytes`` sums chunks handed out, ``total_bytes`` blocks cudaMalloc'd,
  ``free_bytes = total - used``.

Not emulated: other streams (arenas), the device itself running out of memory.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Iterable

UNIT = 512                 # ALLOCATION_UNIT_SIZE
BASE_STEP = 2 ** 40        # emulated cudaMalloc bases: 1 << 40, 2 << 40, ...
TIES = ("newest", "address", "oldest")


def round_size(size: int) -> int:
    """CuPy's ``_round_size``: up to a multiple of 512 bytes (cudaMalloc's alignment)."""
    return (size + UNIT - 1) // UNIT * UNIT


class PoolOutOfMemory(MemoryError):
    """What CuPy's OutOfMemoryError reports: the request, the pool's total, the limit."""

    def __init__(self, size: int, total: int, limit: int) -> None:
        super().__init__(f"Out of memory allocating {size:,} bytes "
                         f"(allocated so far: {total:,} bytes, limit set to: {limit:,} bytes).")
        self.size, self.total, self.limit = size, total, limit


class _Chunk:
    __slots__ = ("base", "offset", "size", "prev", "next", "free", "stamp")

    def __init__(self, base: int, offset: int, size: int) -> None:
        self.base, self.offset, self.size = base, offset, size
        self.prev: _Chunk | None = None
        self.next: _Chunk | None = None
        self.free = False
        self.stamp = 0

    @property
    def address(self) -> int:
        return self.base + self.offset


class PoolEmulator:
    """CuPy's ``SingleDeviceMemoryPool`` without a device; addresses are emulated.

    ``tie`` chooses among free chunks of the chosen size, where CuPy takes the ``_Chunk``
    object lowest in the interpreter's heap: "newest" the chunk that became free last (it
    agreed best with two H200 traces), "address" the lowest address, "oldest" the first."""

    def __init__(self, limit: int = 0, tie: str = "newest") -> None:
        if tie not in TIES:
            raise ValueError(f"tie must be one of {TIES}, not {tie!r}")
        self.limit, self.tie = limit, tie
        self._used = self._total = 0
        self.used_peak = self.total_peak = 0
        self.n_cuda_malloc = 0
        self._next_base = BASE_STEP
        self._in_use: dict[int, _Chunk] = {}
        self._free: dict[int, list[_Chunk]] = {}      # size -> free chunks of that size
        self._sizes: list[int] = []                   # sorted sizes that have free chunks
        self._clock = 0

    # counters ------------------------------------------------------------------------------
    def used_bytes(self) -> int:
        return self._used

    def total_bytes(self) -> int:
        return self._total

    def free_bytes(self) -> int:
        return self._total - self._used

    def n_free_blocks(self) -> int:
        return sum(len(chunks) for chunks in self._free.values())

    # the free set --------------------------------------------------------------------------
    def _insert(self, chunk: _Chunk) -> None:
        chunk.free = True
        self._clock += 1
        chunk.stamp = self._clock
        chunks = self._free.setdefault(chunk.size, [])
        if not chunks:
            bisect.insort(self._sizes, chunk.size)
        chunks.append(chunk)

    def _remove(self, chunk: _Chunk) -> None:
        chunks = self._free[chunk.size]
        chunks.remove(chunk)
        chunk.free = False
        if not chunks:
            del self._free[chunk.size]
            self._sizes.pop(bisect.bisect_left(self._sizes, chunk.size))

    def _pick(self, chunks: list[_Chunk]) -> _Chunk:
        key = {"address": lambda c: c.address, "newest": lambda c: -c.stamp,
               "oldest": lambda c: c.stamp}[self.tie]
        return min(chunks, key=key)

    def _get_chunk(self, size: int) -> _Chunk | None:
        """``_Arena.get_chunk``: best fit, split off the remainder as a free chunk."""
        i = bisect.bisect_left(self._sizes, size)
        if i == len(self._sizes):
            return None
        chunk = self._pick(self._free[self._sizes[i]])
        self._remove(chunk)
        if chunk.size > size:
            self._insert(self._split(chunk, size))     # merge=False
        return chunk

    def _split(self, chunk: _Chunk, size: int) -> _Chunk:
        """``_Chunk.split``: ``chunk`` keeps its first ``size`` bytes; the rest, returned."""
        rest = _Chunk(chunk.base, chunk.offset + size, chunk.size - size)
        rest.prev, rest.next = chunk, chunk.next
        if chunk.next is not None:
            chunk.next.prev = rest
        chunk.next, chunk.size = rest, size
        return rest

    # the pool's interface ------------------------------------------------------------------
    def malloc(self, size: int) -> int:
        """Hand out ``size`` bytes (rounded); the emulated address, 0 for a 0-byte request."""
        size = round_size(size)
        if size == 0:
            return 0
        chunk = self._get_chunk(size)
        if chunk is None:
            chunk = self._cuda_malloc(size)
        self._in_use[chunk.address] = chunk
        self._used += chunk.size
        self.used_peak = max(self.used_peak, self._used)
        return chunk.address

    def _cuda_malloc(self, size: int) -> _Chunk:
        """``_try_malloc``: the limit check, free_all_blocks and a second check, a new block."""
        if self.limit and size > self.limit:
            raise PoolOutOfMemory(size, self._total, self.limit)
        if self.limit and self._total + size > self.limit:
            self.free_all_blocks()
            if self._total + size > self.limit:
                raise PoolOutOfMemory(size, self._total, self.limit)
        base = self._next_base
        self._next_base += BASE_STEP * (1 + size // BASE_STEP)
        self._total += size
        self.total_peak = max(self.total_peak, self._total)
        self.n_cuda_malloc += 1
        return _Chunk(base, 0, size)

    def add_block(self, base: int, size: int) -> None:
        """A block the pool already held, all free (a reconstructed start; no cudaMalloc)."""
        self._total += size
        self.total_peak = max(self.total_peak, self._total)
        self._next_base = max(self._next_base, (base + size) // BASE_STEP * BASE_STEP + BASE_STEP)
        self._insert(_Chunk(base, 0, size))

    def claim(self, address: int, size: int) -> bool:
        """Mark ``size`` bytes at ``address`` inside a free chunk as handed out (a chunk in use
        before a trace began); False where no free chunk holds them."""
        for chunk in [c for chunks in self._free.values() for c in chunks]:
            if chunk.address <= address and address + size <= chunk.address + chunk.size:
                self._remove(chunk)
                if address > chunk.address:
                    front, chunk = chunk, self._split(chunk, address - chunk.address)
                    self._insert(front)
                if chunk.size > size:
                    self._insert(self._split(chunk, size))
                self._in_use[address] = chunk
                self._used += size
                self.used_peak = max(self.used_peak, self._used)
                return True
        return False

    def free(self, address: int) -> None:
        """Return a chunk: merge with a free next, then a free previous neighbour."""
        if address == 0:
            return
        chunk = self._in_use.pop(address)
        self._used -= chunk.size
        after = chunk.next
        if after is not None and after.free:
            self._remove(after)
            _absorb(chunk, after)
        before = chunk.prev
        if before is not None and before.free:
            self._remove(before)
            _absorb(before, chunk)
            chunk = before
        self._insert(chunk)

    def free_all_blocks(self) -> int:
        """Give back free chunks that are whole blocks (split ones stay); the bytes freed."""
        whole = [c for chunks in self._free.values() for c in chunks
                 if c.prev is None and c.next is None]
        for chunk in whole:
            self._remove(chunk)
            self._total -= chunk.size
        return sum(c.size for c in whole)


@dataclass
class ReplayResult:
    """What a replay learnt: peaks, cudaMalloc count, and per event the emulated address
    (0 for a 0-byte malloc or a free of an unknown key) and the pool's used/total after it."""

    used_peak: int = 0
    total_peak: int = 0
    n_cuda_malloc: int = 0
    unknown_frees: int = 0
    oom_event: int | None = None          # index of the event that raised, if one did
    addresses: list[int] = field(default_factory=list)
    used: list[int] = field(default_factory=list)
    total: list[int] = field(default_factory=list)


def replay(events: Iterable[tuple[str, int, object]], limit: int = 0,
           tie: str = "newest") -> ReplayResult:
    """Replay ``(kind, bytes, key)`` events in program order; stop at an OutOfMemoryError.

    A free whose key no earlier malloc gave is a block held before the trace began: it is
    taken as its own block, in use from the start (so it counts in total and used), and
    returned to the pool at that free, where the real pool got it back."""
    events = list(events)
    pool = PoolEmulator(0, tie)
    seen: set = set()
    held: dict = {}
    result = ReplayResult()
    for kind, nbytes, key in events:               # blocks held before the trace
        if kind == "malloc":
            seen.add(key)
        elif key not in seen and key not in held:
            held[key] = pool.malloc(nbytes)
            result.unknown_frees += 1
    pool.n_cuda_malloc, pool.limit = 0, limit
    address_of = dict(held)
    for index, (kind, nbytes, key) in enumerate(events):
        address = 0
        if kind == "malloc":
            try:
                address = pool.malloc(nbytes)
            except PoolOutOfMemory:
                result.oom_event = index
                break
            address_of[key] = address
        elif kind == "free":
            address = address_of.pop(key, 0)
            pool.free(address)
        else:
            raise ValueError(f"event {index}: kind {kind!r} is neither 'malloc' nor 'free'")
        result.addresses.append(address)
        result.used.append(pool.used_bytes())
        result.total.append(pool.total_bytes())
    result.used_peak, result.total_peak = pool.used_peak, pool.total_peak
    result.n_cuda_malloc = pool.n_cuda_malloc
    return result


def _absorb(first: _Chunk, second: _Chunk) -> None:
    """``second``, right after ``first`` in one block, becomes part of it."""
    first.size += second.size
    first.next = second.next
    if first.next is not None:
        first.next.prev = first
