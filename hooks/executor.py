"""Executor: replay a plan's schedule inside a real Chainer iteration (DESIGN.md, "Executing
a plan inside Chainer").

The executor is a GraphRecorder, so it sees the same op indices and tensor ids as the profile
the plan was made from. At every op boundary it runs the schedule's actions for that boundary:

* ``swap_out``: the device starts copying the map to the host (copy stream, after the work
  already queued); ``release``: wait for that copy, then drop every reference the graph holds
  (the consumer's input ``VariableNode._data``, the producer's ``_retained_output_data``, and
  the array of a still-alive Variable), so the memory really goes;
* ``swap_in``: allocate, start the copy back, and put the new array into exactly the
  references that were dropped; ``wait``: compute waits for that copy;
* ``recompute``: re-run the map's recompute chain (hooks/recompute.py) from maps that are on
  the device, and put the result back the same way;
* ``free``: drop the references; after its last use a Variable the user still holds keeps its
  array (that memory is the user's, as in plain Chainer).

Forward boundary b runs when op b begins (op b-1 is resolved by then); backward boundary j+1
runs as soon as backward op j ends, so frees happen early. Every op is checked against the
profiled graph: a different function, different tensors or shapes, or a different backward
order stop the plan for the rest of the iteration and call ``on_deviation`` (PoocH re-profiles).
From then on, and in iterations without a program (the first profiling iteration), the
executor works on demand: a retained map is swapped out once no Variable refers to it, and a
map a backward op needs but lacks is swapped back in or recomputed right before the op.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable


from pooch_ext.hooks.chainer_refs import (node_array, retained_outputs, set_node_array,
                                          set_retained_outputs, variable_array)
from pooch_ext.hooks.device import Transfer
from pooch_ext.hooks.model_state import base_of
from pooch_ext.hooks.graph import _TAG, GraphRecorder
from pooch_ext.trace import GraphTrace
from pooch_ext.hooks.recompute import recompute
from pooch_ext.hooks.runtime_device import RuntimeDevice
from pooch_ext.hooks.program import ExecutorError, Program

if TYPE_CHECKING:
    from pooch_ext.hooks.profiler import Profiler


@dataclass
class _Slot:
    """Where one feature map of the current iteration is, and which references were dropped.
    A Variable that is alive keeps its array: whoever holds it may read it (PoocH only drops
    the graph's own references, so the memory goes when the Variable does)."""

    state: str = "device"           # device | incoming (swap-in not yet waited) | host | freed
    transfer: Transfer | None = None
    dropped_node: bool = False
    dropped_retained: bool = False


@dataclass
class IterationStats:
    """What the executor did in one iteration."""

    iteration: int
    program: str = ""
    deviation: str = ""
    swap_outs: int = 0
    swap_ins: int = 0
    recomputes: int = 0
    frees: int = 0
    on_demand: int = 0
    peak_bytes: int = 0
    started: float = 0.0                             # perf_counter at the first forward op
    finished: float = 0.0                            # perf_counter after the last backward op
    transfers: list = field(default_factory=list)    # (tensor, Transfer) of this iteration


class Executor(GraphRecorder):
    """Replay ``program`` (set it with ``use(program)``) at op boundaries on ``device``."""

    name = "PoochExecutor"
    record_attrs = False        # op attributes (stride, pad) are for the cost model only

    def __init__(self, model: Any, device: RuntimeDevice, keep_traces: int = 4,
                 on_deviation: Callable[[str], None] | None = None,
                 iteration_done: Callable[[GraphTrace], None] | None = None,
                 backward_done: Callable[[GraphTrace], None] | None = None,
                 link_added: Callable[[Any], None] | None = None) -> None:
        super().__init__(model, keep_traces)
        self.device = device
        self.program: Program | None = None
        self.on_deviation = on_deviation
        self.iteration_done = iteration_done
        self.backward_done = backward_done
        self.link_added = link_added
        self.on_unsupported_run: Callable[[str], None] | None = None
        self.catalog: Callable[[], list[Program]] = lambda: []   # programs to switch to
        self.on_switch: Callable[[Program], None] | None = None
        self.passive = False        # this iteration runs as plain Chainer: nothing is dropped
        self._enforce_after = False  # the device's budget is off for this iteration only
        self._in_data: tuple = ()
        self.timed_transfers = False
        self.profiler: Profiler | None = None     # attached while profiling (its attach())
        self.history: list[IterationStats] = []
        self.stats = IterationStats(-1)
        self.deviation = ""
        self.slots: dict[int, _Slot] = {}
        self._retained_out: dict[int, tuple[int, int]] = {}
        self._inputs_held: dict[int, Any] = {}
        self._candidates: list[int] = []
        self._next_boundary = 0
        self._pending_in_data: tuple | None = None
        self._after_op: list[int] = []
        # what this iteration did to feature maps: its schedule, as (boundary, action, tensor,
        # host seconds, whether it waited for a copy); seconds NaN where not timed (on demand)
        self.executed: list[tuple[int, str, int, float, bool]] = []
        self._queued: tuple | None = None

    def use(self, program: Program | None) -> None:
        """Replay ``program`` from the next iteration on (None: work on demand only)."""
        self._queued = (program,)

    def abandon(self) -> None:
        """Forget the iteration in progress (after an error): nothing more is run for it."""
        self.trace = None
        self._pending = None

    # ------------------------------------------------------------ state of one tensor
    def _node(self, tensor: int) -> Any:
        ref = self.nodes.get(tensor)
        return None if ref is None else ref()

    def array_of(self, tensor: int) -> Any:
        """The tensor's array if any reference still holds it, else None."""
        node = self._node(tensor)
        if node is not None:
            if node_array(node) is not None:
                return node_array(node)
            variable = node.get_variable_or_none()
            if variable is not None and variable_array(variable) is not None:
                return variable_array(variable)
        where = self._retained_out.get(tensor)
        if where is not None:
            function = self.functions[where[0]]()
            data = None if function is None else retained_outputs(function)
            if data is not None and data[where[1]] is not None:
                return data[where[1]]
        return self._inputs_held.get(tensor)

    def _drop(self, tensor: int, slot: _Slot) -> None:
        node = self._node(tensor)
        if node is not None and node_array(node) is not None:
            set_node_array(node, None)
            slot.dropped_node = True
        where = self._retained_out.get(tensor)
        if where is not None:
            function = self.functions[where[0]]()
            data = None if function is None else retained_outputs(function)
            if data is not None and data[where[1]] is not None:
                set_retained_outputs(function, data[:where[1]] + (None,) + data[where[1] + 1:])
                slot.dropped_retained = True

    def _restore(self, tensor: int, slot: _Slot, array: Any) -> None:
        node = self._node(tensor)
        if slot.dropped_node and node is not None:
            set_node_array(node, array)
        if slot.dropped_retained:
            k, position = self._retained_out[tensor]
            function = self.functions[k]()
            if function is not None:
                data = retained_outputs(function)
                set_retained_outputs(function, data[:position] + (array,) + data[position + 1:])
        slot.dropped_node = slot.dropped_retained = False
        self.register_array(array, tensor)
        self.device.track(array, tensor)

    def _slot(self, tensor: int) -> _Slot:
        slot = self.slots.get(tensor)
        if slot is None:
            slot = self.slots[tensor] = _Slot()
        return slot

    # ------------------------------------------------------------ the actions
    def _swap_out(self, tensor: int) -> None:
        slot = self._slot(tensor)
        array = self.array_of(tensor)
        if array is None:
            raise ExecutorError(f"swap_out of tensor {tensor}: no reference holds its array")
        if slot.transfer is not None:
            self.device.discard(slot.transfer)
        slot.transfer = self.device.swap_out(array, self.timed_transfers)
        if self.timed_transfers:
            self.stats.transfers.append((tensor, slot.transfer))
        self.stats.swap_outs += 1

    def _release(self, tensor: int) -> None:
        slot = self._slot(tensor)
        if slot.transfer is None:
            raise ExecutorError(f"release of tensor {tensor} before its swap-out")
        self.device.finish_swap_out(slot.transfer)
        self._drop(tensor, slot)
        slot.state = "host"

    def _swap_in(self, tensor: int) -> None:
        slot = self._slot(tensor)
        if slot.transfer is None or slot.state != "host":
            raise ExecutorError(f"swap_in of tensor {tensor}: it is not on the host")
        held = self._held_by_variable(tensor)
        if held is not None:          # the caller's Variable kept it: no copy needed
            self._restore(tensor, slot, held)
            slot.state = "device"
            self.stats.swap_ins += 1
            return
        array = self.device.swap_in(slot.transfer, self.timed_transfers)
        self._restore(tensor, slot, array)
        slot.state = "incoming"
        self.stats.swap_ins += 1

    def _wait(self, tensor: int) -> None:
        slot = self._slot(tensor)
        if slot.state == "incoming":
            self.device.wait_swap_in(slot.transfer)
            slot.state = "device"

    def _recompute(self, tensor: int) -> None:
        slot = self._slot(tensor)
        chain = self.program.chains.get(tensor) if self.program is not None else None
        if not chain:
            raise ExecutorError(f"tensor {tensor} has no recompute chain")
        values: dict[int, Any] = {}
        for k in chain:
            function = self.functions[k]() if k < len(self.functions) else None
            if function is None:
                raise ExecutorError(f"recompute of tensor {tensor}: forward op {k} is gone")
            inputs = []
            for node in function.inputs:
                tag = getattr(node, _TAG, None)
                if tag is None or tag[0] is not self._serial:      # a parameter
                    variable = node.get_variable_or_none()
                    array = node_array(node) if variable is None else variable_array(variable)
                    if array is None:
                        raise ExecutorError(f"recompute of tensor {tensor}: an input of forward "
                                            f"op {k} that is not a tensor of this iteration is gone")
                    inputs.append(array)
                    continue
                source = tag[1]
                if source not in values:
                    values[source] = self._present(source, tensor)
                inputs.append(values[source])
            outputs = recompute(function, inputs)
            for t, array in zip(self.trace.ops[k].outputs, outputs):
                values[t] = array
        self._restore(tensor, slot, values[tensor])
        slot.state = "device"
        self.stats.recomputes += 1

    def _present(self, source: int, target: int) -> Any:
        """A recompute source's array; a source the schedule left absent is restored now."""
        slot = self.slots.get(source)
        if slot is not None and slot.state != "device":
            self._restore_on_demand(source)
        array = self.array_of(source)
        if array is None:
            raise ExecutorError(f"recompute of tensor {target}: source {source} is not on the device")
        return array

    def _free(self, tensor: int, final: bool) -> None:
        # the host copy (if any) stays until the iteration ends: a later backward pass over
        # the same graph may need the map again
        slot = self._slot(tensor)
        self._drop(tensor, slot)
        slot.state = "host" if final and slot.transfer is not None else "freed"
        self.stats.frees += 1

    def _held_by_variable(self, tensor: int) -> Any:
        node = self._node(tensor)
        variable = None if node is None else node.get_variable_or_none()
        return None if variable is None else variable_array(variable)

    def _act(self, action: str, tensor: int, final: bool) -> None:
        if action == "swap_out":
            self._swap_out(tensor)
        elif action == "release":
            self._release(tensor)
        elif action == "swap_in":
            self._swap_in(tensor)
        elif action == "wait":
            self._wait(tensor)
        elif action == "recompute":
            self._recompute(tensor)
        elif action == "free":
            self._free(tensor, final)
        else:
            raise ExecutorError(f"unknown action {action!r}")

    def _run_until(self, boundary: int) -> None:
        """Run the program's actions of every boundary up to and including ``boundary``."""
        program = self.program
        while self._next_boundary <= boundary:
            if program is not None and not self.deviation and not self.passive:
                for action, tensor, final in program.actions.get(self._next_boundary, ()):
                    waits = not self._landed(action, tensor)
                    start = time.perf_counter()
                    self._act(action, tensor, final)
                    self._log(action, tensor, self._next_boundary,
                              time.perf_counter() - start, waits)
            self._next_boundary += 1

    def _landed(self, action: str, tensor: int) -> bool:
        """Whether ``action`` finds the copy it may wait for already landed (nothing to wait)."""
        slot = self.slots.get(tensor)
        if action == "release" and slot is not None and slot.transfer is not None:
            return self.device.landed(slot.transfer, "out")
        if action == "wait" and slot is not None and slot.state == "incoming":
            return self.device.landed(slot.transfer, "in")
        return True

    def _log(self, action: str, tensor: int, boundary: int | None = None,
             seconds: float = float("nan"), waited: bool = False) -> None:
        """Note an action done to a feature map at ``boundary`` (default: the one just run),
        with the host seconds it took when timed and whether it waited for a copy."""
        self.executed.append((self._next_boundary - 1 if boundary is None else boundary,
                              action, tensor, seconds, waited))

    # ------------------------------------------------------------ on demand
    def _on_demand(self) -> bool:
        return (self.program is None or bool(self.deviation)) and not self.passive

    def _release_unreferenced(self) -> None:
        """Swap out every retained map no Variable refers to any more (its forward is over)."""
        remaining = []
        for tensor in self._candidates:
            slot = self.slots.get(tensor)
            if slot is not None and slot.state != "device":
                continue
            node = self._node(tensor)
            if node is not None and node.get_variable_or_none() is not None:
                remaining.append(tensor)
                continue
            if self.array_of(tensor) is None:
                continue
            self._swap_out(tensor)
            self._release(tensor)
            self._log("swap_out", tensor)
            self._log("release", tensor)
        self._candidates = remaining

    def _restore_on_demand(self, tensor: int) -> None:
        slot = self._slot(tensor)
        if slot.state == "incoming":
            self._wait(tensor)
        elif slot.state == "host":
            self._swap_in(tensor)
            self._wait(tensor)
            self._log("swap_in", tensor)
        elif slot.state == "freed":
            self._recompute(tensor)
            self._log("recompute", tensor)
        else:
            return
        self._after_op.append(tensor)
        self.stats.on_demand += 1

    def _retained(self, op: Any) -> list[int]:
        """The maps ``op`` keeps for its backward, network inputs (the caller's) excluded."""
        kept = [op.inputs[p] for p in op.retain_inputs] + [op.outputs[p] for p in op.retain_outputs]
        tensors = self.trace.tensors
        return [t for t in dict.fromkeys(kept) if tensors[t].producer >= 0]

    # ------------------------------------------------------------ graph checks
    def _deviate(self, reason: str) -> None:
        if self.deviation:
            return
        self.deviation = reason
        self.stats.deviation = reason
        self._unbudgeted()
        for op in self.trace.ops:     # from now on, anything retained may go once unreferenced
            self._candidates.extend(self._retained(op))
        self._candidates = list(dict.fromkeys(self._candidates))
        if self.on_deviation is not None:
            self.on_deviation(reason)

    def _check_resolved(self, index: int) -> None:
        reference = self.program.reference
        if index >= len(reference.ops):
            return
        mine, theirs = self.trace.ops[index], reference.ops[index]
        if (mine.inputs, mine.outputs, mine.retain_inputs, mine.retain_outputs) != \
                (theirs.inputs, theirs.outputs, theirs.retain_inputs, theirs.retain_outputs):
            self._deviate(f"forward op {index} ({mine.name}) reads or keeps different tensors "
                          "than in the profiled graph")
            return
        for t in mine.outputs:
            a, b = self.trace.tensors[t], reference.tensors[t]
            if (a.shape, a.dtype) != (b.shape, b.dtype):
                self._deviate(f"tensor {t} of op {index} ({mine.name}) has shape {a.shape} "
                              f"{a.dtype}, the profiled graph had {b.shape} {b.dtype}")
                return

    # ------------------------------------------------------------ passive iterations
    def _restore_all(self, tensors: Any = None) -> None:
        """Bring back every map this iteration dropped whose graph is still referenced (only
        ``tensors`` when given): what remains of the iteration runs as plain Chainer would."""
        for tensor, slot in list(self.slots.items()):
            if tensors is not None and tensor not in tensors:
                continue
            if slot.state == "device" or not (slot.dropped_node or slot.dropped_retained):
                if slot.state == "incoming":
                    self._wait(tensor)
                continue
            if self._graph_refers(tensor):
                self._restore_on_demand(tensor)
        self._after_op = []

    def _graph_refers(self, tensor: int) -> bool:
        if self._node(tensor) is not None:
            return True
        where = self._retained_out.get(tensor)
        return where is not None and self.functions[where[0]]() is not None

    def _go_passive(self) -> None:
        if not self.passive:
            self.passive = True
            self._unbudgeted()
            self._restore_all()

    def _unbudgeted(self) -> None:
        """The rest of the iteration runs without a plan: no budget was planned for it, so the
        device records its peak but does not stop training over it (a refusal after updates
        would break the promise; the iteration's stats show the peak)."""
        if getattr(self.device, "enforce", False):
            self.device.enforce = False
            self._enforce_after = True

    # ------------------------------------------------------------ GraphRecorder hooks
    def forward_preprocess(self, function: Any, in_data: tuple) -> None:
        self._in_data = in_data
        try:
            super().forward_preprocess(function, in_data)
        finally:
            self._in_data = ()

    def forward_postprocess(self, function: Any, in_data: tuple) -> None:
        if self.profiler is not None:
            self.profiler.forward_function_done(function)
        super().forward_postprocess(function, in_data)
        if self._pending is not None and self._pending[1] is function:
            self._pending_in_data = in_data

    def on_iteration_start(self) -> None:
        if self._enforce_after:
            self.device.enforce, self._enforce_after = True, False
        if self._queued is not None:
            self.program, self._queued = self._queued[0], None
        self.stats = IterationStats(self.iteration, self.program.label if self.program else "")
        self.deviation = ""
        self.passive = False
        self.slots = {}
        self._retained_out = {}
        self._inputs_held = {}
        self._input_bases: set[int] = set()
        self._candidates = []
        self._after_op = []
        self.executed = []
        self._next_boundary = 0
        if self.model is not None and (self.iteration < 4 or self.iteration % 64 == 0):
            # gradients count from the start; optimizer state appears at the first update
            self.device.note_resident(self.model)
        if self.program is None:
            self._unbudgeted()              # nothing planned this iteration's memory
        self.device.reset_peak()
        self.stats.started = time.perf_counter()
        if self.profiler is not None:
            self.profiler.iteration_started()

    def _switch(self, index: int, name: str) -> bool:
        """Go on with another known program if the graph so far is its graph too and this op
        is its op ``index``, and it would have done the same at every boundary so far."""
        for candidate in self.catalog():
            if candidate is self.program or candidate.matches(index, name, self.op_sources,
                                                              self._in_data):
                continue
            ops = candidate.reference.ops
            if any((ops[k].name, ops[k].inputs, ops[k].outputs) != (op.name, op.inputs, op.outputs)
                   for k, op in enumerate(self.trace.ops[:index])):
                continue
            if all(candidate.actions.get(b, []) == self.program.actions.get(b, [])
                   for b in range(self._next_boundary)):
                self.program = candidate
                self.stats.program = candidate.label
                if self.on_switch is not None:
                    self.on_switch(candidate)
                return True
        return False

    def on_pass_start(self, index: int, function: Any, in_data: tuple) -> bool:
        """A new forward pass before any backward: if a plan's graph starts here (and the
        plan being run does not go on here), what ran so far was a forward-only pass."""
        if self.program is None or self.passive:
            return False
        sources = [None] * len(in_data)
        name = type(function).__name__
        if not self.deviation and not self.program.matches(index, name, sources, in_data):
            return False
        for candidate in [self.program] + self.catalog():
            if not candidate.matches(0, name, sources, in_data):
                self.program = candidate
                self._queued = None
                return True
        return False

    def on_forward_only(self, trace: GraphTrace) -> None:
        self._restore_all()
        for slot in self.slots.values():
            if slot.transfer is not None:
                self.device.discard(slot.transfer)
                slot.transfer = None
        if self.profiler is not None:
            self.profiler.forward_only_dropped()

    def on_compact(self, n_ops: int, n_tensors: int) -> None:
        self._restore_all({t for t in self.slots if t < n_tensors})
        for tensor in [t for t in self.slots if t < n_tensors]:
            slot = self.slots.pop(tensor)
            if slot.transfer is not None:
                self.device.discard(slot.transfer)
        shift = {"slots": self.slots, "_inputs_held": self._inputs_held}
        for name, table in shift.items():
            setattr(self, name, {t - n_tensors: v for t, v in table.items() if t >= n_tensors})
        self._retained_out = {t - n_tensors: (k - n_ops, p) for t, (k, p)
                              in self._retained_out.items() if t >= n_tensors and k >= n_ops}
        self._candidates = [t - n_tensors for t in self._candidates if t >= n_tensors]
        self.executed = [(b - n_ops, a, t - n_tensors, s, w) for b, a, t, s, w in self.executed
                         if t >= n_tensors and b >= n_ops]
        if self.profiler is not None:
            self.profiler.compacted(n_ops, n_tensors)

    def on_unsupported(self, reason: str) -> None:
        self._go_passive()
        if self.on_unsupported_run is not None:
            self.on_unsupported_run(reason)

    def on_forward_begin(self, index: int, function: Any) -> None:
        if self.program is not None and not self.deviation and not self.passive:
            name = type(function).__name__
            reason = self.program.matches(index, name, self.op_sources, self._in_data)
            if reason and not self._switch(index, name):
                self._deviate(reason)
        self._run_until(index)
        if self._on_demand():
            self._release_unreferenced()
        self.device.check("forward op", index, function)
        if self.profiler is not None:
            self.profiler.forward_began(index)

    def on_forward_resolved(self, index: int, function: Any) -> None:
        op = self.trace.ops[index]
        in_data, self._pending_in_data = self._pending_in_data, None
        # a profiler times the op's recomputation on its inputs (and holds them until then)
        rerun_inputs = in_data if self.profiler is not None else None
        program = self.program
        tensors = self.trace.tensors
        for node, array in zip(function.inputs, in_data or ()):
            tag = getattr(node, _TAG, None)
            if tag is None or tag[0] is not self._serial or tensors[tag[1]].producer >= 0:
                continue
            # a network input is the caller's (a batch the data set may keep): views of it,
            # such as a reshape, hold no device memory of the iteration's own
            self._input_bases.add(id(base_of(array)))
            if program is not None and tag[1] in program.input_sources:
                self._inputs_held[tag[1]] = array
        del in_data     # the op's inputs are not ours to hold (memory counted below)
        for position, p in enumerate(op.retain_outputs):
            self._retained_out[op.outputs[p]] = (index, position)
        for t in op.outputs:
            array = self.array_of(t)
            if array is not None and id(base_of(array)) not in self._input_bases:
                self.device.track(array, t)
        if program is not None and not self.deviation and not self.passive:
            self._check_resolved(index)
        if self._on_demand():
            self._candidates.extend(t for t in self._retained(op) if t not in self._candidates)
        self.device.check("forward op", index, function)
        if self.profiler is not None:
            self.profiler.forward_resolved(index, function, rerun_inputs)

    def on_backward_begin(self, index: int, fwd_index: int, function: Any) -> None:
        program = self.program
        if program is not None and not self.deviation and not self.passive:
            position = index - len(self.trace.ops)
            reference = program.reference
            if len(self.trace.ops) != len(reference.ops):
                self._deviate(f"forward had {len(self.trace.ops)} ops, the profiled graph "
                              f"{len(reference.ops)}")
            elif position >= len(reference.backward_order) or \
                    reference.backward_order[position] != fwd_index:
                self._deviate(f"backward op {index} differentiates forward op {fwd_index}, "
                              "not the profiled one")
        self._run_until(index)
        if self._on_demand():
            self._release_unreferenced()
        self._restore_for(fwd_index)
        self.device.check("backward op", index, function)
        if self.profiler is not None:
            self.profiler.backward_began(index, fwd_index)

    def backward_postprocess(self, function: Any, in_data: tuple, out_grad: tuple) -> None:
        if self.profiler is not None and self._in_backward:
            self.profiler.backward_function_done()
        super().backward_postprocess(function, in_data, out_grad)

    def _restore_for(self, fwd_index: int) -> None:
        """What forward op ``fwd_index``'s backward reads, back on the device if it is not."""
        for tensor in self._retained(self.trace.ops[fwd_index]):
            slot = self.slots.get(tensor)
            if slot is not None and slot.state != "device":
                self._restore_on_demand(tensor)

    def on_backward_end(self, index: int, fwd_index: int, function: Any) -> None:
        # maps restored outside the schedule go back to where the schedule believes they are
        for tensor in self._after_op:
            slot = self.slots[tensor]
            if slot.state in ("device", "incoming"):
                self._wait(tensor)
                self._drop(tensor, slot)
                slot.state = "host" if slot.transfer is not None else "freed"
                self._log("release", tensor, index + 1)
        self._after_op = []
        self._run_until(index + 1)
        self.device.check("backward op", index, function)
        self.stats.finished = time.perf_counter()

    def on_revisit_begin(self, fwd_index: int, function: Any) -> None:
        """A later backward pass runs op ``fwd_index`` again: it finds what it reads (kept
        there, as plain Chainer would, until the iteration ends)."""
        self._restore_for(fwd_index)
        self._after_op = []

    def on_new_link(self, link: Any) -> None:
        self.device.note_resident(self.model)
        if self.link_added is not None:
            self.link_added(link)

    def on_backward_complete(self, trace: GraphTrace) -> None:
        if self.backward_done is not None:
            self.backward_done(trace)

    def on_iteration_end(self, trace: GraphTrace) -> None:
        if self.profiler is not None:
            self.profiler.iteration_ending()
        program = self.program
        if program is not None and not self.deviation and not self.passive:
            if len(trace.backward_order) != len(program.reference.backward_order):
                self._deviate(f"the iteration ran {len(trace.backward_order)} backward ops, the "
                              f"profiled graph {len(program.reference.backward_order)}")
            else:
                self._run_until(program.n_ops)
        for slot in self.slots.values():
            if slot.transfer is not None:
                self.device.discard(slot.transfer)
                slot.transfer = None
        self._inputs_held = {}
        self._candidates = []
        self.stats.peak_bytes = int(self.device.peak)
        self.history.append(self.stats)
        if self.profiler is not None:
            self.profiler.collect(trace)
        self.stats.transfers = []
        if self.iteration_done is not None:
            self.iteration_done(trace)
