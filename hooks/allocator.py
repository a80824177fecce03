"""Device malloc/free events in program order, attributed to the op that was running.

On a GPU a CuPy ``MemoryHook`` reports every allocation the default pool hands out and takes
back (the paper hooks Chainer's allocator the same way); the CPU device reports the
same events from its accounting. The profiler sets ``log.op`` while an op runs (-1 between
ops), so what an op allocated and freed inside its own window, its scratch, can be measured:
``scratch_bytes`` is the profile's ``transient_bytes``.
"""
from __future__ import annotations

from typing import Any

EVENT_COLUMNS = ("seq", "op", "kind", "bytes", "tensor", "key")


class AllocationLog:
    """Events ``(seq, op, kind, bytes, tensor, key)``; ``key`` pairs a free with its malloc."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.op = -1
        self.enabled = False

    def record(self, kind: str, nbytes: int, tensor: int = -1, key: int = 0) -> None:
        if self.enabled:
            self.events.append((len(self.events), self.op, kind, int(nbytes), tensor, key))

    def clear(self) -> None:
        self.events = []
        self.op = -1


def scratch_bytes(events: list[tuple]) -> dict[int, int]:
    """Per op: the peak bytes of blocks both allocated and freed inside the op's window."""
    windows: dict[int, list[tuple]] = {}
    for event in events:
        if event[1] >= 0:
            windows.setdefault(event[1], []).append(event)
    result: dict[int, int] = {}
    for op, window in windows.items():
        scratch = [False] * len(window)      # mallocs whose block is freed later in the window
        freed_later: set = set()
        for position in range(len(window) - 1, -1, -1):
            _, _, kind, _, _, key = window[position]
            if kind == "free":
                freed_later.add(key)
            elif key in freed_later:
                scratch[position] = True
                freed_later.discard(key)
        live = peak = 0
        open_blocks: dict = {}
        for position, (_, _, kind, nbytes, _, key) in enumerate(window):
            if kind == "malloc" and scratch[position]:
                open_blocks[key] = nbytes
                live += nbytes
                peak = max(peak, live)
            elif kind == "free" and key in open_blocks:
                live -= open_blocks.pop(key)
        result[op] = peak
    return result


def cupy_memory_hook(log: AllocationLog) -> Any:
    """A CuPy MemoryHook feeding ``log`` (use it as a context manager)."""
    import cupy

    class _PoochAllocationHook(cupy.cuda.MemoryHook):
        name = "PoochAllocationHook"

        def malloc_postprocess(self, **kwargs: Any) -> None:
            log.record("malloc", kwargs["mem_size"], -1, kwargs["mem_ptr"])

        def free_postprocess(self, **kwargs: Any) -> None:
            log.record("free", kwargs["mem_size"], -1, kwargs["mem_ptr"])

    return _PoochAllocationHook()
