"""PoocH's step 3 (ours, not the paper's): a local search on the budgeted time, from
several starting plans (``multi_start``), within a fixed amount of simulated work.

Trials whose lower bound (sim/bounds.py: the compute floor, ops, recomputes and action
costs back to back; the link bound, the copy engines' serial work) cannot beat the best
time are skipped without simulating. A skipped trial could not have been an improvement, so
the search takes the same path as one that simulated every trial, only on fewer
simulations: near in-core time most moves that add a recompute are settled by the floor,
on slow links most that add a swap by the link.
"""
from __future__ import annotations

import functools
import itertools
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from pooch_ext.policies.search import (Evaluator, KeepRoom, SearchStats, keep_candidates,
                                       simulation_cost)
from pooch_ext.sim.bounds import compute_floor, floor_shares, in_core_time, link_bound
from pooch_ext.sim.budgets import fits
from pooch_ext.sim.memory import occupy
from pooch_ext.sim.model import KEEP, RECOMPUTE, SWAP, SimModel, per_search, search_memo


# the refinement's work limit, in units of search.simulation_cost, so the time it takes is
# about the same whatever the depth; deep networks still get MIN_REFINE_SIMULATIONS
REFINE_WORK = 1_000_000
MIN_REFINE_SIMULATIONS = 40
MIN_SHARE = 20      # multi_start: the shortest first-round refinement worth making


def refine_budget(model: SimModel) -> int:
    """How many simulations the refinement may spend on ``model`` (about a second or two)."""
    return max(MIN_REFINE_SIMULATIONS, int(REFINE_WORK / simulation_cost(model)))


def _in_a_search(function: Callable) -> Callable:
    """``function(model, ...)`` within a search's memo, its own where called alone: the
    refinement's move ids and visits live there."""
    @functools.wraps(function)
    def within(model: SimModel, *args: Any, **kwargs: Any) -> Any:
        if model.memo is not None:
            return function(model, *args, **kwargs)
        with search_memo(model):
            return function(model, *args, **kwargs)
    return within


@_in_a_search
def refine(model: SimModel, codes: np.ndarray, budget: int, max_simulations: int | None = None,
           stats: SearchStats | None = None, evaluator: Evaluator | None = None,
           host_budget: float = math.inf) -> tuple[np.ndarray, SearchStats]:
    """Step 3 (ours, not the paper's): local search on the budgeted time.

    The two paper steps decide keep before recompute exists, so memory can end up holding
    maps that are cheap to rebuild while expensive ones are swapped. Moves: switch a swapped
    map to recompute or a recomputed one to swap; demote a kept map (to recompute or swap)
    and refill the memory it frees with other maps, output side first, wherever they fit;
    change every map of a group at once: coordinated moves no single change reaches, such as
    keeping one map and rebuilding another instead. The groups widen in phases, each run
    until it finds nothing: neighbouring pairs, then neighbouring triples, then, where a
    round of them costs no more than the simulation limit (small networks), any two maps.
    First improvement, and the scan goes on after the improving move instead of starting
    over, so simulations go to moves not yet tried since the last change (nor from these
    classes in this search: ``_Base.visited``). Ends when the widest phase finds nothing or
    ``max_simulations`` (default ``refine_budget``) new simulations are spent. A given
    ``evaluator`` brings its own host budget.
    """
    started = time.perf_counter()
    stats = stats or SearchStats()
    ev = evaluator or Evaluator(model, budget, stats, host_budget)
    limit = refine_budget(model) if max_simulations is None else max_simulations
    first_simulation = ev.stats.simulations
    best_time = ev.time(codes)
    floor = in_core_time(model)
    phases = ["pairs", "triples"]
    if 9 * model.m * (model.m - 1) // 2 <= limit:
        phases.append("any two")      # built only if reached
    tried: set[bytes] = set()   # a trial that did not win once never will: best only falls
    allowed, shares, base = model.can.tolist(), floor_shares(model), None
    for phase in phases:
        if best_time <= floor or ev.stats.simulations - first_simulation >= limit:
            break
        slots, ids = _phase_moves(model, phase)
        pos = since = 0
        if base is None or base.codes is not codes:
            base = _Base(model, codes, budget, allowed, ev.host_budget)
        visited = base.visited()
        while since < len(slots) and best_time > floor:
            if ev.stats.simulations - first_simulation >= limit:
                break
            move_id = ids[pos]
            pos, since = (pos + 1) % len(slots), since + 1
            if visited[move_id]:
                continue
            visited[move_id] = 1
            trial = _trial(model, base, slots[pos - 1], shares, best_time, stats)
            if trial is None or (key := trial.tobytes()) in tried:
                continue
            tried.add(key)
            t = _trial_time(model, trial, best_time, ev, budget, stats)
            if t < best_time * (1 - 1e-9):
                visited[move_id] = 0    # from these classes it wins again (another seed's
                codes, best_time, since = trial, t, 0       # refinement may pass here)
                base = _Base(model, codes, budget, allowed, ev.host_budget)
                visited = base.visited()
    stats.refine_simulations += ev.stats.simulations - first_simulation
    stats.seconds += time.perf_counter() - started
    return codes, stats


def _trial_time(model: SimModel, trial: np.ndarray, best_time: float, ev: Evaluator,
                budget: int, stats: SearchStats) -> float:
    """The trial's budgeted time where it may beat ``best_time``, else infinity: the
    cheapest test first (compute floor), then the fit, then the link bound (reusing the
    fit's lifetimes), and only then a simulation, cut off at ``best_time``."""
    if _below(compute_floor(model, trial), best_time):
        stats.refine_pruned += 1
        return math.inf
    if not fits(model, trial, budget, ev.host_budget):
        return math.inf
    if _below(link_bound(model, trial), best_time):
        stats.refine_pruned += 1
        return math.inf
    return ev.time(trial, cutoff=best_time * (1 - 1e-9))


def _phase_moves(model: SimModel, phase: str) -> tuple[list[tuple], list[int]]:
    """A phase's moves and an id of each (the same move, the same id, in every phase), made
    once per search (multi_start refines several seeds)."""
    def make() -> tuple[list[tuple], list[int]]:
        slots = _moves(model, _groups(model, phase))
        registry: dict[tuple, int] = per_search(model, "refine move ids", dict)
        return slots, [registry.setdefault(move, len(registry)) for move in slots]
    return per_search(model, f"refine moves: {phase}", make)


def _groups(model: SimModel, phase: str) -> list[tuple[int, ...]]:
    """The groups of maps a phase changes at once: neighbouring pairs; neighbouring pairs
    and triples; any two maps and neighbouring triples."""
    if phase == "pairs":
        return _windows(model, 2)
    if phase == "triples":
        return _windows(model, 2) + _windows(model, 3)
    return ([(i, j) for i in range(model.m) for j in range(i + 1, model.m)]
            + _windows(model, 3))


def _windows(model: SimModel, width: int) -> list[tuple[int, ...]]:
    """Every run of ``width`` neighbouring maps (in tensor order)."""
    return [tuple(range(lo, lo + width)) for lo in range(model.m - width + 1)]


def _moves(model: SimModel, groups: list[tuple[int, ...]]) -> list[tuple]:
    """Every move of the refinement in scan order; whether one applies depends on the classes.

    ("flip", i): swap <-> recompute; ("demote", i, c): a kept map to class c, then refill
    (cheapest rebuilds first); ("group", maps, combo): each of ``maps`` takes its class in
    ``combo`` (applies only where every one of them changes).
    """
    slots: list[tuple] = [("flip", int(i)) for i in np.argsort(-model.tensor)]
    cheapest = sorted(range(model.m),
                      key=lambda j: model.rc_s[j] if model.can[j, RECOMPUTE] else math.inf)
    slots += [("demote", i, c) for i in cheapest for c in (RECOMPUTE, SWAP)]
    combos = {}
    for group in groups:
        width = len(group)
        if width not in combos:
            combos[width] = list(itertools.product((KEEP, SWAP, RECOMPUTE), repeat=width))
        slots += [("group", group, combo) for combo in combos[width]]
    return slots


class _Base:
    """The classes the refinement moves from, and their keep room (made when first asked:
    a demotion to swap changes no lifetime, so its room is this one less the map's hole)."""

    def __init__(self, model: SimModel, codes: np.ndarray, budget: int,
                 allowed: list[list[bool]], host_budget: float = math.inf) -> None:
        self.model, self.codes, self.budget, self.host_budget = model, codes, budget, host_budget
        self._room: KeepRoom | None = None
        self._candidates: list[int] | None = None
        # plain lists (``allowed``: model.can's, made once per refine): most moves are ruled
        # out by a class or two, and NumPy scalars one at a time cost more than the test
        self.classes: list[int] = codes.tolist()
        self.allowed = allowed
        self.floor = compute_floor(model, codes)

    def room(self) -> KeepRoom:
        if self._room is None:
            self._room = KeepRoom(self.model, self.codes, self.budget)
        return self._room

    def candidates(self) -> list[int]:
        """``keep_candidates`` of these classes: a demoted map's refill takes them (the map
        itself, kept here, is not among them), so they are made once per base."""
        if self._candidates is None:
            self._candidates = keep_candidates(self.model, self.codes)
        return self._candidates

    def visited(self) -> bytearray:
        """Which moves (by id) were tried from these classes in this search, by any refine
        call under the same budgets: trying one again gives what it gave then (its trial is
        the same; the best time then was these classes' time, as it is now), so it is
        passed over."""
        by_base: dict[bytes, bytearray] = per_search(
            self.model, f"refine visited: {self.budget}, {self.host_budget}", dict)
        visited = by_base.setdefault(self.codes.tobytes(), bytearray())
        known = len(per_search(self.model, "refine move ids", dict))
        if len(visited) < known:        # (a phase's moves are made when it is reached)
            visited.extend(bytes(known - len(visited)))
        return visited


_FLIPPED = {SWAP: RECOMPUTE, RECOMPUTE: SWAP}


def _trial(model: SimModel, base: _Base, move: tuple, shares: list[list[float]],
           best_time: float, stats: SearchStats) -> np.ndarray | None:
    """The classes after ``move`` from ``base.codes``; None where it does not apply, or where
    it moves a map or three and its compute floor, summed from the base's before any array
    is made, settles beyond rounding that it cannot beat ``best_time`` (counted as pruned)."""
    if move[0] == "demote":
        return _demote(model, base, move[1], move[2])
    changes = _changes(base, move)
    if changes is None:
        return None
    if _surely_below(base.floor + sum(shares[j][c] - shares[j][base.classes[j]]
                                      for j, c in changes), best_time):
        stats.refine_pruned += 1
        return None
    trial = base.codes.copy()
    for j, c in changes:
        trial[j] = c
    return trial


def _changes(base: _Base, move: tuple) -> list[tuple[int, int]] | None:
    """The (map, class) changes a flip or group move makes from ``base``, or None where it
    does not apply."""
    classes, allowed = base.classes, base.allowed
    if move[0] == "flip":
        i = move[1]
        new = _FLIPPED.get(classes[i])
        if new is None or not allowed[i][new]:
            return None
        return [(i, new)]
    group, combo = move[1], move[2]
    if any(classes[j] == c or not allowed[j][c] for j, c in zip(group, combo)):
        return None
    return list(zip(group, combo))


def _demote(model: SimModel, base: _Base, i: int, new: int) -> np.ndarray | None:
    """A kept map ``i`` to class ``new``, then the memory refilled; None where it does not
    apply."""
    if base.classes[i] != KEEP or not base.allowed[i][new]:
        return None
    trial = base.codes.copy()
    trial[i] = new
    if new == SWAP:
        room = base.room()
        top = room.top.copy()
        occupy(top, room.lo[i], room.hi[i], -int(model.nbytes[i]))
    else:
        room = KeepRoom(model, trial, base.budget)
        top = room.top
    # refilled wherever the memory allows, output side first
    trial[room.fill(top, base.candidates())] = KEEP
    return trial


@dataclass
class _Result:
    """A seed's refinement in multi_start: its time, seed, classes, and whether it ended at
    its share of simulations (still improving) rather than at a local optimum."""

    time_s: float
    seed: str
    codes: np.ndarray
    improving: bool


@_in_a_search
def multi_start(model: SimModel, seeds: dict[str, np.ndarray | None], budget: int,
                max_simulations: int | None = None, stats: SearchStats | None = None,
                host_budget: float = math.inf) -> tuple[np.ndarray, SearchStats]:
    """Refine several starting plans; the fastest result wins.

    A local search ends in the local optimum of the basin it starts in, and which basin the
    paper's steps land in depends on the link: on slow links they start from all-swap and
    keep maps whose swaps nothing can hide, far from a good plan. Seeds from other regions
    (a recompute-only checkpoint plan, whose time does not depend on the link at all) give
    starting points a slower link does not spoil. The simulations are shared out in two
    rounds: every seed (fastest first) gets a short refinement of ``limit / (2 x seeds)``,
    then the best result so far gets all that is left; where that ends at a local optimum
    with simulations to spare (bounds skip many trials), the next best results that were
    still improving get them, in order. A seed's own time says little about
    its basin (the checkpoint plan often starts fastest and ends slowest), a short
    refinement says much more, but not one of fewer than MIN_SHARE simulations (deep
    networks): then the fastest seed gets the whole limit.
    """
    stats = stats or SearchStats()
    ev = Evaluator(model, budget, stats, host_budget)
    limit = refine_budget(model) if max_simulations is None else max_simulations
    ready = {name: codes for name, codes in seeds.items() if codes is not None}
    if not ready:
        raise ValueError("multi_start needs at least one seed that is not None")
    stats.seed_times = {name: ev.time(codes) for name, codes in ready.items()}
    spent = stats.refine_simulations
    share = limit // (2 * len(ready))
    order = sorted(ready, key=lambda k: stats.seed_times[k])
    if share < MIN_SHARE:       # too little to tell basins apart: all on the fastest seed
        order, share = order[:1], limit
    found: list[_Result] = []
    for name in order:
        before = stats.refine_simulations
        codes, _ = refine(model, ready[name], budget, share, stats, ev)
        found.append(_Result(ev.time(codes), name, codes,
                             stats.refine_simulations - before >= share))
        if found[-1].time_s <= in_core_time(model):
            break
    # the rest of the limit: the best result first, then, where it stopped at a local
    # optimum with simulations left, the next best that was still improving
    found.sort(key=lambda r: r.time_s)
    for entry in found:
        left = limit - (stats.refine_simulations - spent)
        if left <= 0 or entry.time_s <= in_core_time(model):
            break
        if entry is found[0] or entry.improving:
            entry.codes, _ = refine(model, entry.codes, budget, left, stats, ev)
            entry.time_s = ev.time(entry.codes)
    winner = min(found, key=lambda r: r.time_s)
    stats.seed = winner.seed
    return winner.codes, stats


def _surely_below(approximate: float, best_time: float) -> bool:
    """``_below`` of a bound known to within 1e-11 of itself (summed in another order), where
    that settles it: a trial that passes is tested again on its exact bound."""
    return approximate * (1 - 1e-10) >= best_time * (1 - 1e-9)


def _below(bound: float, best_time: float) -> bool:
    """Whether a plan with lower bound ``bound`` cannot improve on ``best_time`` by refine's
    margin (up to rounding in the bound)."""
    return bound * (1 - 1e-12) >= best_time * (1 - 1e-9)
