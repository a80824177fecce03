"""When something beyond PoocH's control lets go of a tensor (``TensorRecord.held_until``).

A VariableNode keeps only a weak reference to its Variable, so a weakref callback on the
Variable tells when the caller's code let go of a tensor; one on a function node tells until
when it held what it retains for its backward (what matters for an op whose backward the first
pass never runs). As the iteration ends, ``settle`` turns that into each tensor's
``held_until``: still held (-2) becomes HELD_TO_END, and what a revisited op, or a living node
whose backward never ran, retains is held as long as they were.
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Callable

from pooch_ext.trace import HELD_TO_END, GraphTrace, OpRecord, TensorRecord

STILL_HELD = -2


class HoldingWatch:
    """Weakref watches on the holders of one iteration's tensors; ``position()`` is the op
    running when a holder dies."""

    def __init__(self, position: Callable[[], int]) -> None:
        self.position = position
        self.reset()

    def reset(self) -> None:
        """A new iteration: callbacks of the previous one's holders change nothing."""
        self._iteration = object()
        self._refs: list[weakref.ref] = []      # weakrefs whose callbacks measure holding
        self._holders: list[tuple[weakref.ref, list[TensorRecord]]] = []
        self._node_death: list[list] = []       # [OpRecord, op at which its node died or -2]

    def holder(self, holder: Any, records: list[TensorRecord]) -> None:
        """Until ``holder`` dies, mark ``records`` as held (-2: still held); its death records
        the op at which it let go (records, not ids: a compaction renumbers them)."""
        if not records:
            return
        iteration = self._iteration
        for record in records:
            if record.held_until != HELD_TO_END:
                record.held_until = STILL_HELD

        def released(_ref: Any) -> None:
            if self._iteration is iteration:
                for record in records:
                    if record.held_until == STILL_HELD:
                        record.held_until = max(self.position(), 0)
        try:
            ref = weakref.ref(holder, released)
        except TypeError:
            return
        self._refs.append(ref)
        self._holders.append((ref, records))

    def node(self, function: Any, op: OpRecord) -> None:
        """Note when ``op``'s function node dies: until then it holds what it retains."""
        iteration, cell = self._iteration, [op, STILL_HELD]
        self._node_death.append(cell)

        def released(_ref: Any) -> None:
            if self._iteration is iteration:
                cell[1] = max(self.position(), 0)
        self._refs.append(weakref.ref(function, released))

    def compact(self, n_ops: int) -> None:
        """The first ``n_ops`` ops left the iteration: renumber the ops nodes died at."""
        for cell in self._node_death:
            if cell[1] >= 0:
                cell[1] = max(0, cell[1] - n_ops)

    def settled(self, trace: GraphTrace) -> GraphTrace:
        """A copy of ``trace`` settled as if the iteration ended now (the watches go on): the
        trace a check before the iteration ends plans with, as its end will."""
        copy = dataclasses.replace(trace, tensors=[dataclasses.replace(t) for t in trace.tensors])
        self._settle(copy, {id(t): c for t, c in zip(trace.tensors, copy.tensors)})
        return copy

    def settle(self, trace: GraphTrace) -> None:
        """The iteration ended: every tensor's ``held_until`` from what was seen; the watches
        end here."""
        self._settle(trace, {id(t): t for t in trace.tensors})
        self._refs, self._holders = [], []

    def _settle(self, trace: GraphTrace, records: dict[int, TensorRecord]) -> None:
        """``records``: the trace's record for each watched record (by id; a copy's)."""
        for record in trace.tensors:      # still held by a Variable as the iteration ends
            if record.held_until == STILL_HELD:
                record.held_until, record.caller_held = HELD_TO_END, True
        for ref, held in self._holders:      # with its gradient (``retain_grad=True``)
            holder = ref()
            if holder is not None and getattr(holder, "grad", None) is not None:
                for record in (records.get(id(r)) for r in held):
                    if record is not None and record.caller_held:
                        record.caller_grad = True
        visited = set(trace.backward_order)
        death = {id(op): at for op, at in self._node_death}
        for k, op in enumerate(trace.ops):
            kept = [op.inputs[p] for p in op.retain_inputs] + \
                [op.outputs[p] for p in op.retain_outputs]
            if k in trace.revisited:          # later passes read what these ops keep
                until = HELD_TO_END
            elif k not in visited and id(op) in death:    # kept for a backward that never
                at = death[id(op)]                        # ran, while the node lived
                until = HELD_TO_END if at == STILL_HELD else at
            else:
                continue
            for t in kept:
                record = trace.tensors[t]
                if record.producer >= 0 and record.held_until != HELD_TO_END:
                    record.held_until = max(record.held_until, until)
