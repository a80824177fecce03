"""Which graph comes next. A loop whose graph changes in a pattern (an LSTM whose state is
reset every third iteration, a branch taken every fourth) meets its graphs in an order that
repeats. An iteration starts on one graph's program and can change to another only where
both did the same so far (hooks/executor.py ``_switch``): graphs that share their first ops
and part later could not, and such an iteration went on on demand from there, over the
budget (22% on a user's LSTM), while the iteration after it, another graph, was the one
measured whole. ``GraphOrder`` predicts the next graph from the order seen so far: the one
that came, more than once and every time, after the same few graphs in a row; PoocH starts
the iteration on that graph's program, or measures it whole where it has none yet. (Once is
not enough: in a random order, stochastic depth's, a run of graphs met once says nothing.)"""
from __future__ import annotations

from typing import Hashable


class GraphOrder:
    """The graphs met, in order, and what came after each run of them."""

    def __init__(self, longest: int = 4, remembered: int = 4096) -> None:
        self.longest, self.remembered = longest, remembered
        self._forget()

    def _forget(self) -> None:
        self._ids: dict[Hashable, int] = {}            # graph (signature) -> small number
        self._graphs: list[Hashable] = []
        self._history: list[int] = []
        # a run of graphs -> what followed it, and how often
        self._after: dict[tuple[int, ...], dict[int, int]] = {}

    def saw(self, graph: Hashable) -> None:
        """``graph`` ran (an iteration ended on it)."""
        number = self._ids.get(graph)
        if number is None:
            if len(self._graphs) >= self.remembered:     # a loop of ever new graphs: start over
                self._forget()
            number = self._ids[graph] = len(self._graphs)
            self._graphs.append(graph)
        history = self._history
        for k in range(1, min(self.longest, len(history)) + 1):
            came = self._after.setdefault(tuple(history[-k:]), {})
            came[number] = came.get(number, 0) + 1
        history.append(number)
        del history[:-self.longest]

    def next(self) -> Hashable | None:
        """The graph that followed the longest run of the latest graphs met more than once
        every time; None where different graphs followed it or no run was met twice."""
        for k in range(len(self._history), 0, -1):
            came = self._after.get(tuple(self._history[-k:]))
            if came is not None and len(came) > 1:
                return None
            if came is not None and sum(came.values()) > 1:
                return self._graphs[next(iter(came))]
        return None
