"""Measured memory for the CPU device: a counting NumPy allocator, built on first use.

``counter()`` returns the compiled ``_pooch_cpu_memory`` module (cpu_memory.c: NumPy's NEP 49
allocator hook forwarding to malloc/free and counting the bytes of array data alive and their
peak), or None where it cannot be built (no C compiler, no Python headers, NumPy older than
1.22): then the CPU device falls back to counting the arrays the graph holds and says so
(``CpuDevice.memory_source``).

Why an allocator hook rather than ``tracemalloc``: tracemalloc sees NumPy's data (NumPy
reports it) but mixes in every Python object the graph is made of, which on a small network
outweighs the feature maps; a snapshot that separates NumPy's domain costs time proportional
to every live allocation, far too much at each op boundary. The hook counts exactly the
arrays' bytes, in C, at the moment they are allocated and freed, temporaries inside a
function (im2col columns) included.

The module is compiled on first use (pooch_ext/cbuild.py).
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import sysconfig
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Iterator

import numpy as np

from pooch_ext.cbuild import BUILD_ERRORS, compiled, failure as build_failure

SOURCE = Path(__file__).with_name("cpu_memory.c")
MODULE = "_pooch_cpu_memory"
HANDLER = "pooch_ext_counting"      # the allocator's name as NumPy reports it
_loaded: list["Counter | None"] = []        # [counter or None] once tried
failure = ""                                 # why it could not be built, if it could not


def handler_name(array: np.ndarray) -> str | None:
    """The name of the allocator that owns ``array``'s data (None for a view)."""
    try:
        from numpy._core.multiarray import get_handler_name      # NumPy 2
    except ImportError:
        from numpy.core.multiarray import get_handler_name       # NumPy 1.22 - 1.26
    return get_handler_name(array)


class Counter:
    """The compiled module's counters by name (the C side keeps one reader for all four)."""

    LIVE, PEAK, WINDOW, BLOCKS = range(4)

    def __init__(self, module: ModuleType) -> None:
        self.module = module

    def use(self, on: bool) -> bool:
        """Count NumPy data allocated from now on in this context (or not); was it before?"""
        return self.module.use(on)

    def begin(self) -> None:
        """Count from zero; arrays allocated before never count again (even when freed)."""
        self.module.begin()

    def live(self) -> int:
        """Bytes of counted array data alive now."""
        return self.module.read(self.LIVE)

    def peak(self) -> int:
        """Most counted bytes alive at once since ``reset_peak``."""
        return self.module.read(self.PEAK)

    def window(self) -> int:
        """Most counted bytes alive at once since ``reset_window`` (the profiler's per op)."""
        return self.module.read(self.WINDOW)

    def blocks(self) -> int:
        """Counted blocks alive now."""
        return self.module.read(self.BLOCKS)

    def counted_bytes(self, array: np.ndarray) -> int:
        """Bytes of ``array``'s own buffer that count now (0 for another allocator's data or
        an earlier epoch's)."""
        if array.base is not None or handler_name(array) != HANDLER:
            return 0
        return self.module.counted_size(array.__array_interface__["data"][0])

    def reset_peak(self) -> int:
        return self.module.restart(self.PEAK)

    def reset_window(self) -> int:
        return self.module.restart(self.WINDOW)

    @contextmanager
    def above_live(self, found: list[int]) -> Iterator[None]:
        """Append to ``found`` the most bytes the block held at once above what was live when
        it began (its scratch), counted in the device's peak as ever; the window keeps its
        own high point too."""
        live, window = self.live(), self.reset_window()
        try:
            yield
        finally:
            found.append(max(0, self.window() - live))
            self.module.lift(self.WINDOW, window)

    @contextmanager
    def apart(self) -> Iterator[None]:
        """Count inside the block (its own live and peak can be read), then take it out of
        the peak and the window: arrays it made and freed were never the device's (PoocH's
        measurements on probes while an iteration runs)."""
        was = self.use(True)
        peak, window = self.peak(), self.window()
        try:
            yield
        finally:
            self.use(was)
            for k, value in ((self.PEAK, peak), (self.WINDOW, window)):
                self.module.restart(k)
                self.module.lift(k, value)


def counter() -> Counter | None:
    """The counting allocator, built if needed; None if it cannot be had here."""
    global failure
    if _loaded:
        return _loaded[0]
    module = None
    try:
        target = compiled(SOURCE, MODULE, importlib.machinery.EXTENSION_SUFFIXES[0],
                          [f"-I{sysconfig.get_paths()['include']}", f"-I{np.get_include()}"])
        spec = importlib.util.spec_from_file_location(MODULE, target)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module = Counter(module)
    except BUILD_ERRORS as error:
        failure = build_failure(error)
        module = None
    _loaded.append(module)
    return module
