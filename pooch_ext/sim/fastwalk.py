"""The simulator's boundary walk in C (walk.c), for the runs a search makes.

A search simulates thousands of plans and half of each run's time went to the walk in
Python, one boundary at a time (ResNet-50: about 3,000 runs of 353 boundaries). walk.c
takes the same steps in the same order with the same double arithmetic, built without
floating-point contraction, so a run's results are equal bit for bit and every plan the
searches choose is the same (tests/test_fastwalk.py compares the two on random plans,
budgets and cutoffs). It serves timing "early" unrecorded, which is what the searches
run; recordings, the other timings and vDNN walk in Python, as does everything where
walk.c cannot be loaded (sim/clib.py says why) or ``POOCH_PYTHON_WALK=1`` is set.
"""
from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

import numpy as np

from pooch_ext.sim.clib import for_model
from pooch_ext.sim.lifetimes import swap_wait_pairs
from pooch_ext.sim.model import RECOMPUTE, SWAP, per_search

if TYPE_CHECKING:
    from pooch_ext.sim.engine import _Run

_P = ctypes.c_void_p
_I = ctypes.c_int64
_D = ctypes.c_double


class _Walk(ctypes.Structure):
    """walk.c's ``Walk``, field for field."""

    _fields_ = [("n", _I), ("n_fwd", _I), ("m", _I), ("dur", _P), ("top", _P),
                ("budget", _D), ("unlimited", _I), ("over", _P),
                ("first_at", _P), ("end_at", _P), ("last_fwd", _P), ("nbytes", _P),
                ("so_s", _P), ("si_s", _P), ("rc_s", _P),
                ("so_ptr", _P), ("so_idx", _P), ("rc_ptr", _P), ("rc_idx", _P),
                ("src_ptr", _P), ("src_idx", _P), ("op_ptr", _P), ("op_idx", _P),
                ("free_count", _P), ("queue", _P), ("n_queue", _I),
                ("rest", _P), ("cutoff", _D),
                ("c_so", _D), ("c_rel", _D), ("c_si", _D), ("c_wait", _D), ("c_rc", _D),
                ("c_free", _D),
                ("so_done", _P), ("si_done", _P), ("stall_d2h", _P), ("stall_h2d", _P),
                ("released", _P), ("l_out", _P), ("l_in", _P),
                ("inflight", _P), ("done_wait", _P),
                ("t", _D), ("forward_end", _D),
                ("cut_short", _I), ("overflow", _I), ("ov_b", _I), ("ov_i", _I),
                ("ov_top", _I), ("error_i", _I)]


def serves(run: "_Run") -> bool:
    """Whether the C walk takes ``run`` (else it walks in Python)."""
    return run.rec is None and run.timing == "early" and for_model(run.model) is not None


def _grouped(boundaries: np.ndarray, maps: np.ndarray, n: int) -> list[np.ndarray]:
    """Maps grouped by boundary (0..n), each group in the order given: [offsets, maps]."""
    order = np.argsort(boundaries, kind="stable")
    offsets = np.zeros(n + 2, np.int64)
    np.cumsum(np.bincount(boundaries, minlength=n + 1), out=offsets[1:])
    return [offsets, maps[order]]


def _wait_groups(run: "_Run", life: Any) -> list[np.ndarray]:
    """lifetimes.swap_wait_pairs grouped by boundary: where a recompute reads a swapped map as a
    source, then where only an op needs it ([offsets, maps] each)."""
    (read_maps, read_b), (op_maps, op_b) = swap_wait_pairs(run.model, life)
    return _grouped(read_b, read_maps, run.n) + _grouped(op_b, op_maps, run.n)


class _Search:
    """What every run of one model reuses (made once per search): its constant arrays, the
    buffers the walk writes, and the call's structure with their addresses filled in."""

    def __init__(self, run: "_Run") -> None:
        model, m = run.model, run.model.m
        self.constant = [np.ascontiguousarray(a, dtype) for a, dtype in (
            (model.last_fwd, np.int64), (model.nbytes, np.int64), (model.so_s, np.float64),
            (model.si_s, np.float64), (model.rc_s, np.float64))]
        self.floats = np.empty(4 * m)              # so_done, si_done, stall_d2h, stall_h2d
        self.flags = np.empty(3 * m, np.uint8)     # released, l_out, l_in
        self.scratch = np.empty(2 * max(m, 1), np.int64)   # inflight ring, done_wait
        self.state = _Walk(n=run.n, n_fwd=run.n_fwd, m=m)
        f, g, h = (a.ctypes.data for a in (self.floats, self.flags, self.scratch))
        for k, name in enumerate(("last_fwd", "nbytes", "so_s", "si_s", "rc_s")):
            setattr(self.state, name, self.constant[k].ctypes.data)
        for k, name in enumerate(("so_done", "si_done", "stall_d2h", "stall_h2d")):
            setattr(self.state, name, f + 8 * k * m)
        for k, name in enumerate(("released", "l_out", "l_in")):
            setattr(self.state, name, g + k * m)
        self.state.inflight, self.state.done_wait = h, h + 8 * max(m, 1)
        for name, value in zip(("c_so", "c_rel", "c_si", "c_wait", "c_rc", "c_free"),
                               (run.c_so, run.c_rel, run.c_si, run.c_wait, run.c_rc, run.c_free)):
            setattr(self.state, name, value)


# the walk's per-run integer inputs, packed into one array in this order
_PACKED = ("first_at", "end_at", "over", "so_ptr", "so_idx", "rc_ptr", "rc_idx", "src_ptr",
           "src_idx", "op_ptr", "op_idx", "queue", "free_count")


def prepare(run: "_Run", codes: np.ndarray, life: Any, rest: np.ndarray | None,
            over: np.ndarray) -> None:
    """What ``walk`` and ``run.result`` read of a run the C walk takes (``over``: the ops
    that may need a forced release, the engine's rule)."""
    swapped = np.flatnonzero(codes == SWAP)
    run.swapped = swapped.tolist()
    run.fast = (codes, life, rest, over, swapped,
                swapped[np.lexsort((swapped, life.first[swapped]))])


def walk(run: "_Run") -> None:
    """``run.walk()`` in C: its state afterwards is what the Python walk leaves that
    ``run.result`` reads (time, forward end, copies' ends and stalls per map, L_O and L_I,
    cut short, overflow)."""
    assert run.fast is not None
    codes, life, rest, over, swapped, queue = run.fast
    n, m = run.n, run.model.m
    search: _Search = per_search(run.model, "fast walk", lambda: _Search(run))
    state, floats, flags = search.state, search.floats, search.flags
    rebuilt = np.flatnonzero(codes == RECOMPUTE)
    frees = (np.bincount(np.concatenate((life.end, run.model.last_fwd[rebuilt] + 1)),
                         minlength=n + 1) if run.c_free else np.zeros(0, np.int64))
    parts = [life.first, life.end, over, *_grouped(run.model.producer[swapped] + 1, swapped, n),
             *_grouped(life.rc_point[rebuilt], rebuilt, n), *_wait_groups(run, life),
             queue, frees]
    packed = np.concatenate(parts, dtype=np.int64, casting="unsafe")
    address, offset = packed.ctypes.data, 0
    for name, part in zip(_PACKED, parts):
        setattr(state, name, address + 8 * offset)
        offset += len(part)
    if not run.c_free:
        state.free_count = None
    timed = np.concatenate((run.dur_array, rest if rest is not None else ()))
    state.dur = timed.ctypes.data
    state.rest = timed.ctypes.data + 8 * n if rest is not None else None
    floats[:m], floats[m:2 * m], floats[2 * m:] = 0.0, np.inf, 0.0
    flags[:] = 0
    state.top, state.budget, state.unlimited = run.top.ctypes.data, run.budget, run.unlimited
    state.n_queue, state.cutoff = len(queue), run.cutoff
    error = for_model(run.model).walk(ctypes.addressof(state))
    if error:
        i = int(state.error_i)
        raise ValueError(f"swap-out of tensor {int(run.model.tensor[i])} never completes "
                         f"(copy times must be finite and >= 0; got {float(run.model.so_s[i])!r} s)")
    run.t, run.forward_end, run.cut_short = state.t, state.forward_end, bool(state.cut_short)
    run.so_done = floats[:m].tolist()
    run.stall_d2h, run.stall_h2d = floats[2 * m:3 * m].copy(), floats[3 * m:].copy()
    run.l_out = set(np.flatnonzero(flags[m:2 * m]).tolist())
    run.l_in = set(np.flatnonzero(flags[2 * m:]).tolist())
    if state.overflow:
        run.overflow = run.overflow_message(int(state.overflow), int(state.ov_b),
                                            int(state.ov_i), int(state.ov_top))
