"""On demand: what the executor does to feature maps where no schedule says what to do.

Used in the iterations without a program (the first profiling iteration) and for the rest of
an iteration whose graph deviated from its plan: a retained map is swapped out once no
Variable refers to it (its forward is over), and a map a backward op needs but lacks is
swapped back in or recomputed right before the op. A scheduled iteration uses the same
restore where the schedule left a map absent that something reads (a recompute source, a
later backward pass over the same graph); after that op, the map goes back to where the
schedule believes it is. A passive iteration (plain Chainer from then on) gets every dropped
map back (``restore_all``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pooch_ext.hooks.executor import Executor


class OnDemand:
    """Swap-outs of unreferenced maps and restores of absent ones, for ``executor``."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.reset()

    def reset(self) -> None:
        """A new iteration: nothing watched, nothing restored."""
        self.candidates: list[int] = []   # retained maps to swap out once unreferenced
        self.after_op: list[int] = []     # maps restored outside the schedule, this op

    def retained(self, op: Any) -> list[int]:
        """The maps ``op`` keeps for its backward, network inputs (the caller's) excluded."""
        kept = [op.inputs[p] for p in op.retain_inputs] + [op.outputs[p] for p in op.retain_outputs]
        tensors = self.executor.trace.tensors
        return [t for t in dict.fromkeys(kept) if tensors[t].producer >= 0]

    def held_by_the_loop(self) -> bool:
        """Whether a Variable still refers to a map made so far in this iteration. A forward
        pass that begins then does not follow a forward-only one to drop (an unrolled RNN's
        steps before one backward: the state links each step to the next; restarting the
        plan at each step had brought every swapped map of the steps before back, a user's
        truncated-BPTT segment 32% over its budget)."""
        maps, tensors = self.executor.maps, self.executor.trace.tensors
        for tensor, record in enumerate(tensors):
            node = maps.node(tensor) if record.producer >= 0 else None
            if node is not None and node.get_variable_or_none() is not None:
                return True
        return False

    def watch(self, tensors: list[int]) -> None:
        """Swap ``tensors`` out as soon as no Variable refers to them."""
        self.candidates.extend(t for t in tensors if t not in self.candidates)

    def release_unreferenced(self) -> None:
        """Swap out every watched map no Variable refers to any more (its forward is over)."""
        maps = self.executor.maps
        remaining = []
        for tensor in self.candidates:
            slot = maps.slots.get(tensor)
            if slot is not None and slot.state != "device":
                continue
            node = maps.node(tensor)
            if node is not None and node.get_variable_or_none() is not None:
                remaining.append(tensor)
                continue
            if maps.array_of(tensor) is None:
                continue
            maps.swap_out(tensor)
            maps.release(tensor)
            self.executor.log_action("swap_out", tensor)
            self.executor.log_action("release", tensor)
        self.candidates = remaining

    def restore(self, tensor: int) -> None:
        """Bring ``tensor`` back on the device now, however it went (a copy still landing, on
        the host, or freed and recomputed)."""
        executor, maps = self.executor, self.executor.maps
        slot = maps.slot(tensor)
        if slot.state == "incoming":
            maps.wait(tensor)
        elif slot.state == "host":
            maps.swap_in(tensor)
            maps.wait(tensor)
            executor.log_action("swap_in", tensor)
        elif slot.state == "encoded":
            maps.decode(tensor, keep_encoded=True)
            executor.log_action("decode", tensor)
        elif slot.state == "freed":
            maps.recompute(tensor)
            executor.log_action("recompute", tensor)
        else:
            return
        self.after_op.append(tensor)
        executor.stats.on_demand += 1

    def _still_encoded(self, tensor: int) -> bool:
        """Whether ``tensor``'s encoded form is still on the device (a restore decoded it)."""
        maps = self.executor.maps
        return maps.twin_of(tensor) in maps.blobs

    def restore_for(self, fwd_index: int) -> None:
        """What forward op ``fwd_index``'s backward reads, back on the device if it is not."""
        slots = self.executor.maps.slots
        for tensor in self.retained(self.executor.trace.ops[fwd_index]):
            slot = slots.get(tensor)
            if slot is not None and slot.state != "device":
                self.restore(tensor)

    def put_back(self, boundary: int) -> None:
        """Maps restored outside the schedule go back to where the schedule believes they
        are (logged as released at ``boundary``)."""
        maps = self.executor.maps
        for tensor in self.after_op:
            slot = maps.slots[tensor]
            if slot.state in ("device", "incoming"):
                maps.wait(tensor)
                maps.drop(tensor, slot)
                slot.state = "host" if slot.transfer is not None else \
                    "encoded" if self._still_encoded(tensor) else "freed"
                self.executor.log_action("release", tensor, boundary)
        self.after_op = []

    def restore_all(self, tensors: Any = None, copies_only: bool = False) -> int:
        """Bring back every map this iteration dropped whose graph is still referenced (only
        ``tensors`` when given; ``copies_only``: only those with a copy to come back from):
        what remains of the iteration runs as plain Chainer would. Returns how many."""
        maps, restored = self.executor.maps, 0
        for tensor, slot in list(maps.slots.items()):
            if tensors is not None and tensor not in tensors or \
                    copies_only and slot.state == "freed":
                continue
            if slot.state == "device" or not (slot.dropped_node or slot.dropped_retained):
                if slot.state == "incoming":
                    maps.wait(tensor)
                continue
            if maps.graph_refers(tensor):
                self.restore(tensor)
                restored += 1
        self.after_op = []
        return restored

    def compact(self, n_tensors: int) -> None:
        """The first ``n_tensors`` tensors left the iteration: renumber the watched ones."""
        self.candidates = [t - n_tensors for t in self.candidates if t >= n_tensors]
