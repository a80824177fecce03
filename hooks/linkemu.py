"""Link emulation: make host <-> device copies last as long as on a slower link.

PoocH's decisions depend on the link (the paper's x86 PCIe gen3 box recomputes more than its
NVLink box). To run that comparison on one machine, the copies of a fast link are stretched
to a preset's speed: a copy of ``n`` bytes must take at least ``link.swap_out_s(n)`` (D2H) or
``link.swap_in_s(n)`` (H2D); a copy already slower than that is left alone.

* ``stretched_s(native_s, target_s)`` / ``extra_s``: the CPU device's analogue (its copy times
  are a link model, so the emulated time is the larger of the two; ``emulated_link`` is the
  link the CPU device then plans with);
* ``CopyThrottle`` does it on a CUDA copy stream, self-timed: a one-thread kernel stamps the
  GPU's global timer just before the copy, and another one, queued right after it, waits until
  the stamp plus the target time has passed. Everything later on that stream (the copy's done
  event, the next copy) waits with it, so no host thread and no calibration are involved, and
  the copy engine still runs at full speed for the bytes themselves. The wait also ends after
  ``4 * ns`` SM clock cycles, so a timer that does not advance cannot hang the stream.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

from pooch_ext.links import Link, get_link

DIRECTIONS = ("d2h", "h2d")

CUDA_SOURCE = r"""
// PTX only (no headers): %globaltimer is the GPU's nanosecond clock, %clock64 the SM's cycles.
__device__ __forceinline__ unsigned long long pooch_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ long long pooch_cycles() {
    long long c;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(c));
    return c;
}

extern "C" __global__ void pooch_link_stamp(unsigned long long* slot) {
    *slot = pooch_now();
}

extern "C" __global__ void pooch_link_hold(const unsigned long long* slot,
                                           unsigned long long ns) {
    const unsigned long long start = *slot;
    const long long c0 = pooch_cycles();
    const long long cap = (long long)(ns) * 4;   // cycles: ends the wait if the timer stalls
    while (pooch_now() - start < ns && pooch_cycles() - c0 < cap) {
        asm volatile("nanosleep.u32 256;");
    }
}
"""


def copy_s(link: Link | str, direction: str, nbytes: float) -> float:
    """Seconds ``link`` takes to copy ``nbytes`` in ``direction`` ('d2h' or 'h2d')."""
    link = get_link(link)
    if direction == "d2h":
        return link.swap_out_s(nbytes)
    if direction == "h2d":
        return link.swap_in_s(nbytes)
    raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")


def extra_s(native_s: float, target_s: float) -> float:
    """The delay to add to a copy that took ``native_s`` so that it takes ``target_s``."""
    return max(0.0, float(target_s) - float(native_s))


def stretched_s(native_s: float, target_s: float) -> float:
    """How long an emulated copy takes: never faster than the target, never faster than itself."""
    return float(native_s) + extra_s(native_s, target_s)


def emulated_link(native: Link | str, target: Link | str) -> Link:
    """The link a stretched copy behaves like: per direction the lower bandwidth, the higher
    latency (exactly ``target`` when it is the slower one, as emulation is meant to be)."""
    native, target = get_link(native), get_link(target)
    return Link(target.name, min(native.d2h_bytes_per_s, target.d2h_bytes_per_s),
                min(native.h2d_bytes_per_s, target.h2d_bytes_per_s),
                max(native.latency_s, target.latency_s))


def target_ns(link: Link | str, direction: str, nbytes: float) -> int:
    """The emulated duration of one copy in whole nanoseconds (what the hold kernel waits for)."""
    return int(round(copy_s(link, direction, nbytes) * 1e9))


class CopyThrottle:
    """Stretches the copies a CupyDevice issues on its streams to the speed of ``target``.

    ``with throttle.around(stream, "d2h", nbytes): <queue the copy on stream>`` queues the
    stamp kernel before the copy and the hold kernel after it, both on ``stream``.
    """

    def __init__(self, target: Link | str, cupy: Any) -> None:
        self.target = get_link(target)
        self.cupy = cupy
        # one timestamp slot per direction: a stream runs its copies one after the other
        self._slots = cupy.zeros(len(DIRECTIONS), dtype=np.uint64)
        self._stamp = cupy.RawKernel(CUDA_SOURCE, "pooch_link_stamp")
        self._hold = cupy.RawKernel(CUDA_SOURCE, "pooch_link_hold")
        self.copies = 0

    def target_ns(self, direction: str, nbytes: int) -> int:
        return target_ns(self.target, direction, nbytes)

    @contextmanager
    def around(self, stream: Any, direction: str, nbytes: int) -> Iterator[None]:
        slot = self._slots[DIRECTIONS.index(direction):]
        ns = np.uint64(self.target_ns(direction, nbytes))
        with stream:
            self._stamp((1,), (1,), (slot,))
        yield
        with stream:
            self._hold((1,), (1,), (slot, ns))
        self.copies += 1
