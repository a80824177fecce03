"""Op configurations (issue 14): the ways an op can run (a convolution in pieces), each with
its own time and internal peak, and the rule that picks one per op for a plan.

A configuration changes only what happens inside its op: its duration and its high point
above the boundary level (a smaller column buffer); no level at any boundary moves. So for
given classes the choice is separable per op: the fastest configuration whose top fits the
budget at the op's tightest level (``choose``) keeps every plan whose classes fit with the
smallest configurations feasible, and the feasibility questions (sim/budgets.py) use each
op's smallest peak. A plan may also fix the configurations (``Plan.configs``, op -> pieces).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd


@dataclass
class OpConfigs:
    """Per op with alternatives (``ops``, ascending): its configurations, fastest first
    (ties: the smaller peak first), as pieces, seconds and internal peak bytes; pieces 1 is
    the op as the profile measured or charged it."""

    ops: np.ndarray
    pieces: list[np.ndarray]
    dur: list[np.ndarray]
    peak: list[np.ndarray]
    _table: "_Table | None" = field(default=None, init=False, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.ops)

    def table(self) -> "_Table":
        """The configurations as rectangles (made once): ``choose`` and ``applied`` run in
        every simulation, and a NumPy call per op there cost a third of a classification."""
        if self._table is None:
            self._table = _Table.of(self)
        return self._table

    def pieces_of(self, chosen: np.ndarray) -> dict[int, int]:
        """op -> pieces for the chosen configurations that are not whole."""
        return {int(k): int(p[c]) for k, p, c in zip(self.ops, self.pieces, chosen)
                if p[c] != 1}

    def index_of(self, configs: dict[int, int]) -> np.ndarray:
        """Chosen indexes from op -> pieces (ops left out run whole); ValueError on an op
        without that configuration."""
        position = {int(k): j for j, k in enumerate(self.ops)}
        chosen = np.array([int(np.flatnonzero(p == 1)[0]) for p in self.pieces], np.int64)
        for op, pieces in configs.items():
            j = position.get(int(op))
            if j is None:
                if int(pieces) == 1:
                    continue
                raise ValueError(f"op {op} has no configuration of {pieces} pieces")
            match = np.flatnonzero(self.pieces[j] == int(pieces))
            if len(match) == 0:
                raise ValueError(f"op {op} has no configuration of {pieces} pieces")
            chosen[j] = int(match[0])
        return chosen


@dataclass(frozen=True)
class _Table:
    """One row per op with alternatives, padded to the most configurations: seconds, peak
    bytes, which cells are real, and each row's smallest-peak configuration."""

    dur: np.ndarray
    peak: np.ndarray
    real: np.ndarray
    smallest: np.ndarray

    @staticmethod
    def of(configs: OpConfigs) -> "_Table":
        rows, width = len(configs.ops), max((len(p) for p in configs.peak), default=0)
        dur, peak = np.zeros((rows, width)), np.zeros((rows, width), np.int64)
        real = np.zeros((rows, width), bool)
        for j, (d, p) in enumerate(zip(configs.dur, configs.peak)):
            dur[j, :len(d)], peak[j, :len(p)], real[j, :len(p)] = d, p, True
        smallest = np.array([int(np.argmin(p)) for p in configs.peak], np.int64)
        return _Table(dur, peak, real, smallest)


def compile_configs(ops: pd.DataFrame, op_of: np.ndarray, signed: np.ndarray,
                    transient: np.ndarray, peak_inc: np.ndarray, dur: np.ndarray) -> OpConfigs:
    """The configurations of the profile's ops (column ``configs``). ``op_of``, ``signed``,
    ``transient``: the memory events the model keeps (op, signed bytes, whether a transient
    one), in order; ``peak_inc`` and ``dur``: each op's whole peak and seconds. A
    configuration's peak is the op's events with its transient ones scaled to the
    configuration's transient bytes (an op without transient events: its peak plus them)."""
    rows = [(k, cfgs) for k, cfgs in enumerate(ops["configs"]) if len(cfgs)]
    out = OpConfigs(np.array([k for k, _ in rows], np.int64), [], [], [])
    if not rows:
        return out
    # each op's events, in order (columns and groups taken once: cell by cell, this took
    # most of a compile)
    wholes = ops["transient_bytes"].to_numpy(np.int64)
    measured = ops["duration_s"].to_numpy(float)
    by_op = np.argsort(op_of, kind="stable")
    starts = np.searchsorted(op_of[by_op], np.arange(len(ops) + 1))
    for k, cfgs in rows:
        whole = int(wholes[k])
        at = by_op[starts[k]:starts[k + 1]]
        events, scratch = signed[at], transient[at]
        peaks = [int(peak_inc[k])]
        for _, nbytes, _ in cfgs:
            if whole > 0 and scratch.any():
                scaled = np.where(scratch, (events * (nbytes / whole)).astype(np.int64), events)
                peaks.append(max(0, int(np.cumsum(scaled).max())))
            else:
                peaks.append(int(peak_inc[k]) + int(nbytes))
        pieces = np.array([1] + [c[0] for c in cfgs], np.int64)
        seconds = np.array([dur[k]] + [c[2] + dur[k] - measured[k] for c in cfgs])
        order = np.lexsort((np.array(peaks), seconds))
        out.pieces.append(pieces[order])
        out.dur.append(seconds[order])
        out.peak.append(np.array(peaks, np.int64)[order])
    return out


def smallest(configs: OpConfigs, dur: np.ndarray, peak_inc: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, peak) per op with each op's fastest duration and its smallest peak: the
    bounds the budget-free time and the feasibility questions use."""
    dur, peak_inc = dur.copy(), peak_inc.copy()
    for k, d, p in zip(configs.ops, configs.dur, configs.peak):
        dur[k] = d[0]
        peak_inc[k] = p.min()
    return dur, peak_inc


def choose(configs: OpConfigs, tight_level: np.ndarray, extra: np.ndarray,
           budget: float) -> np.ndarray:
    """Per op with alternatives, the fastest configuration whose top (the op's tightest
    level plus the larger of its peak and a recompute's extra there) fits ``budget``; where
    none does, the smallest."""
    table, ops = configs.table(), configs.ops
    tops = tight_level[ops][:, None] + np.maximum(table.peak, extra[ops][:, None])
    fits = (tops <= budget) & table.real
    return np.where(fits.any(axis=1), fits.argmax(axis=1), table.smallest)


def applied(configs: OpConfigs, chosen: np.ndarray, dur: np.ndarray, peak_inc: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, peak) per op with the chosen configurations in place."""
    dur, peak_inc = dur.copy(), peak_inc.copy()
    if len(configs.ops):
        table, rows = configs.table(), np.arange(len(configs.ops))
        dur[configs.ops] = table.dur[rows, chosen]
        peak_inc[configs.ops] = table.peak[rows, chosen]
    return dur, peak_inc
