"""Budgets: resolving the user's budgets, refusing those no plan can meet, and the static
questions the policies ask before any simulation (does a class vector fit, the smallest peak
any schedule of it reaches, the minimum budget, the least-swapping plan). They depend only on
the classes (sim/model.py's static bounds), never on simulated time.
"""
from __future__ import annotations

import math

import numpy as np

from pooch_ext.errors import BudgetTooSmallError, HostBudgetTooSmallError
from pooch_ext.profile import Profile
from pooch_ext.sim.lifetimes import lifetimes, static_top
from pooch_ext.sim.model import KEEP, RECOMPUTE, SWAP, SimModel, compile_profile, host_peak
from pooch_ext.units import parse_bytes


def resolve_budget(profile: Profile, budget: int | str | None) -> int:
    """A budget in bytes (an int, or a string such as "16GiB"); None is the device capacity."""
    return int(profile.device.capacity_bytes if budget is None else parse_bytes(budget))


def require_budget(profile: Profile, budget: int | str | None, what: str = "") -> int:
    """``resolve_budget``, refusing one below ``minimum_budget`` with BudgetTooSmallError
    (``what``: who asked, for the message)."""
    budget_bytes = resolve_budget(profile, budget)
    minimum = minimum_budget(profile)
    if budget_bytes < minimum:
        raise BudgetTooSmallError(budget_bytes, minimum, what)
    return budget_bytes


def minimum_budget(profile: Profile) -> int:
    """The smallest budget any plan can run in: every map swapped (or, where it may not be,
    recomputed or kept), each present only while an op reads it."""
    return model_minimum(compile_profile(profile))


def model_minimum(model: SimModel) -> int:
    """``minimum_budget`` of a compiled model."""
    return least_peak(model, tightest_codes(model))


def budget_between(profile: Profile, fraction: float) -> int:
    """A budget ``fraction`` of the way from the smallest any plan reaches (0) to the in-core
    need (1), in whole bytes: how experiments and tests pick budgets that leave plans a
    choice."""
    return fraction_between(minimum_budget(profile), profile.incore_peak_bytes, fraction)


def fraction_between(floor: int, incore: int, fraction: float) -> int:
    """``floor + fraction * (incore - floor)`` in whole bytes: budget_between's rule, also for
    bounds that are maxima over several profiles."""
    return int(floor + fraction * (incore - floor))


def tightest_codes(model: SimModel) -> np.ndarray:
    """Swap where allowed, else recompute where allowed, else keep."""
    return np.where(model.can[:, 1], SWAP, np.where(model.can[:, 2], RECOMPUTE, KEEP))


def checkpoint_codes(model: SimModel, spacing: int) -> np.ndarray:
    """Keep every ``spacing``-th map counted from the input side, recompute the others (kept
    where they cannot be): Chen et al.'s checkpointing, which swaps nothing."""
    codes = np.full(model.m, KEEP)
    for i in range(model.m):
        if (i + 1) % spacing and model.can[i, RECOMPUTE]:
            codes[i] = RECOMPUTE
    return codes


def least_peak(model: SimModel, codes: np.ndarray) -> int:
    """The lowest peak any schedule of these classes reaches (the simulator reaches it when
    the budget demands)."""
    _, top = static_top(model, lifetimes(model, codes), minimal=True)
    return int(top.max())


def fits(model: SimModel, codes: np.ndarray, budget: int, host_budget: float = math.inf) -> bool:
    """Whether some schedule of these classes fits ``budget`` (the simulator finds it) and
    the host budget (every schedule of them holds the same host memory)."""
    return ((host_budget == math.inf or host_peak(model, codes) <= host_budget)
            and least_peak(model, codes) <= budget)


# ------------------------------------------------------------------ host memory

def resolve_host_budget(host_budget: int | str | float | None) -> float:
    """A host budget in bytes (an int, or a string such as "64GiB"; 0 allowed); None (or
    infinity) is unlimited, returned as math.inf so that comparisons need no special case."""
    if host_budget is None or host_budget == math.inf:
        return math.inf
    return parse_bytes(host_budget, allow_zero=True)


def require_host_budget(profile: Profile, budget_bytes: int,
                        host_budget: int | str | float | None, what: str = "") -> float:
    """``resolve_host_budget``, refusing one below ``minimum_host_budget`` at ``budget_bytes``
    with HostBudgetTooSmallError (computed only when a host budget is given)."""
    limit = resolve_host_budget(host_budget)
    if math.isfinite(limit):
        minimum = minimum_host_budget(profile, budget_bytes)
        if limit < minimum:
            raise HostBudgetTooSmallError(int(limit), minimum, budget_bytes, what)
    return limit


def minimum_host_budget(profile: Profile, budget: int | str | None = None) -> int:
    """The least host memory a plan within the device ``budget`` needs: the host peak of
    ``least_swap_codes`` (0 when a plan that swaps nothing fits). A budget below
    ``minimum_budget`` raises BudgetTooSmallError."""
    budget_bytes = require_budget(profile, budget)
    model = compile_profile(profile)
    return host_peak(model, least_swap_codes(model, budget_bytes))


def least_swap_codes(model: SimModel, budget: int) -> np.ndarray:
    """The classes with the fewest swapped bytes the planner knows within ``budget`` (which
    ``minimum_budget`` must allow).

    The host peak is the swapped maps' bytes, so a plan that swaps nothing is the answer
    wherever one fits: the checkpoint plan of the smallest spacing that fits (in-core
    first). Otherwise ``_unswapped`` from the tightest plan, in both tie orders, the fewer
    bytes winning. Its host peak (``minimum_host_budget``) is the refusal threshold: every
    host budget from it on has this plan, so the pooch search, which starts from it too,
    always finds a feasible plan there. It bounds the least over all 3^m classifications
    from above; on random networks small enough to enumerate it met that least in all but
    4 of 960 cases (one map more).
    """
    for spacing in range(1, model.m + 2):
        codes = checkpoint_codes(model, spacing)
        if fits(model, codes, budget):
            return codes
    tries = [_unswapped(model, budget, side) for side in (1, -1)]
    return min(tries, key=lambda codes: host_peak(model, codes))


def _unswapped(model: SimModel, budget: int, side: int) -> np.ndarray:
    """The tightest plan with its swapped maps, largest first (equal sizes: input side first
    for ``side`` 1, output side first for -1), switched to recompute or keep, whichever
    leaves the lower peak, wherever one fits ``budget``. Leaving swap only adds device
    memory, so one pass suffices: a switch that does not fit now never fits later."""
    codes = tightest_codes(model)
    order = sorted(np.flatnonzero(codes == SWAP).tolist(),
                   key=lambda j: (-int(model.nbytes[j]), side * int(model.tensor[j])))
    for i in order:
        best_peak, best = budget + 1, None
        for cls in (RECOMPUTE, KEEP):
            if model.can[i, cls]:
                trial = codes.copy()
                trial[i] = cls
                peak = least_peak(model, trial)
                if peak < best_peak:
                    best_peak, best = peak, trial
        if best is not None:
            codes = best
    return codes
