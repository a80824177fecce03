"""Lower bounds on a plan's iteration time that need no simulation.

The compute engine runs every op, every recompute and the runtime's host work for each
action one after another, and waits only add to that; so their sum bounds the budgeted
(and the budget-free) time from below whatever the copies do (``compute_floor``; nearly the
time itself for plans that swap nothing and have no convolution configurations to choose,
sqrt-n's checkpoint plans). The copy engines give a second bound (``link_bound``): a budget
only delays copies. The searches use them to skip simulating plans that cannot beat the
best found.
"""
from __future__ import annotations

import numpy as np

from pooch_ext.sim.lifetimes import lifetimes
from pooch_ext.sim.model import RECOMPUTE, SWAP, SimModel, per_search


def in_core_time(model: SimModel) -> float:
    """Every op back to back at its fastest configuration (with rounding slack): no plan can
    be faster."""
    return float(model.dur.sum()) * (1 + 1e-12)


def compute_floor(model: SimModel, codes: np.ndarray) -> float:
    """The compute engine's own work under classes ``codes``: ops at their fastest
    configuration, each recompute, and the host seconds of the actions every schedule of
    them takes (a swap-out and a swap-in per swapped map, a recompute per rebuilt map).
    Each map's share per class is tabled once per search: the refinement asks this of
    every trial."""
    ops, share, offsets = _floor_arrays(model)
    return ops + float(share[offsets + codes].sum())


def floor_shares(model: SimModel) -> list[list[float]]:
    """Each map's terms of ``compute_floor`` per class, as lists (made once per search): the
    refinement's quick floor of a move that changes a map or three, from its base's."""
    return per_search(model, "compute_floor shares",
                      lambda: _floor_arrays(model)[1].reshape(-1, 3).tolist())


def _floor_arrays(model: SimModel) -> tuple[float, np.ndarray, np.ndarray]:
    """(every op's seconds, each map's extra compute-engine seconds per class flattened
    as map x class, each map's offset in it), made once per search."""
    def make() -> tuple[float, np.ndarray, np.ndarray]:
        act = model.act_s
        share = np.zeros((model.m, 3))
        share[:, SWAP] = act.get("swap_out", 0.0) + act.get("swap_in", 0.0)
        share[:, RECOMPUTE] = model.rc_s + act.get("recompute", 0.0)
        return float(model.dur.sum()), share.ravel(), 3 * np.arange(model.m)
    return per_search(model, "compute_floor", make)


def link_bound(model: SimModel, codes: np.ndarray) -> float:
    """A lower bound from the copy engines, memory ignored: swap-outs in producer order,
    each after its producer's forward end at the earliest; swap-ins in first-need order,
    each after its swap-out and the forward pass; every op from a map's first need on runs
    after its swap-in. Exact for nothing, but it sees the stalls a slow link forces, which
    the compute floor does not."""
    is_swapped = codes == SWAP
    if not is_swapped.any():
        return 0.0
    fwd_end, after, by_producer_all = _link_arrays(model)
    by_producer = by_producer_all[is_swapped[by_producer_all]]
    so_done = np.empty(model.m)
    so_done[by_producer] = _serial_done(fwd_end[model.producer[by_producer]],
                                        model.so_s[by_producer])
    first = lifetimes(model, codes).first
    swapped = np.flatnonzero(is_swapped)
    by_need = swapped[np.argsort(first[swapped], kind="stable")]
    ready = np.maximum(so_done[by_need], float(fwd_end[-1]) if model.n_fwd else 0.0)
    si_done = _serial_done(ready, model.si_s[by_need])
    return float((si_done + after[first[by_need]]).max())


def seconds_from(model: SimModel) -> np.ndarray:
    """(n+1,) the ops' seconds from each boundary on (0 at the end): what compute still
    has to do there, recomputes aside."""
    return np.concatenate([np.cumsum(model.dur[::-1])[::-1], [0.0]])


def _link_arrays(model: SimModel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(forward end of each forward op, seconds of the ops from each boundary on, the maps
    in producer order): what ``link_bound`` needs of ``model``, made once per search."""
    return per_search(model, "link_bound", lambda: (
        np.cumsum(model.dur[:model.n_fwd]), seconds_from(model),
        np.lexsort((np.arange(model.m), model.producer))))


def _serial_done(ready: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """End times of copies on one engine, in order, each starting when ready and after the
    previous one: a max-plus scan."""
    total = np.cumsum(seconds)
    return total + np.maximum.accumulate(ready - (total - seconds))


def lower_bound(model: SimModel, codes: np.ndarray) -> float:
    """The larger of ``compute_floor`` and ``link_bound``."""
    return max(compute_floor(model, codes), link_bound(model, codes))
