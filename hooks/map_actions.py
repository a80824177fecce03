"""The feature maps of the iteration in progress and the actions that move them (DESIGN.md,
"Executing a plan inside Chainer"): where each map is, which of the graph's references to it
were dropped, and the six schedule actions, done the same way whether the executor replays a
schedule (hooks/executor.py) or works on demand (hooks/ondemand.py).

* ``swap_out``: the device starts copying the map to the host (copy stream, after the work
  already queued); ``release``: wait for that copy, then drop every reference the graph holds
  (the consumer's input ``VariableNode._data``, the producer's ``_retained_output_data``, and
  the array of a still-alive Variable), so the memory really goes;
* ``swap_in``: allocate, start the copy back, and put the new array into exactly the
  references that were dropped; ``wait``: compute waits for that copy;
* ``recompute``: re-run the map's recompute chain (hooks/recompute.py) from maps that are on
  the device, and put the result back the same way;
* ``free``: drop the references; after its last use a Variable the user still holds keeps its
  array (that memory is the user's, as in plain Chainer);
* ``encode`` / ``decode`` (issue 16): store the map in its encoded form (hooks/codecs.py) and
  drop the references / put the decoded map back. The encoded form is a map of its own id
  (``Program.encoded``) that the schedule swaps, waits for and frees like any other; its
  array lives in ``blobs``, not in the graph.
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from chainer.backend import get_array_module

from pooch_ext.builder import nbytes_of
from pooch_ext.errors import SpentGraphError
from pooch_ext.hooks import codecs
from pooch_ext.hooks.chainer_refs import (node_array, retained_outputs, set_node_array,
                                          set_retained_outputs, variable_array)
from pooch_ext.hooks.device import Transfer, broadcast_core
from pooch_ext.hooks.function_nodes import TAG
from pooch_ext.hooks.program import SCHEDULED, ExecutorError
from pooch_ext.hooks.recompute import recompute
from pooch_ext.hooks.relu_mask import read_mask

if TYPE_CHECKING:
    from pooch_ext.hooks.executor import Executor


@dataclass
class Slot:
    """Where one feature map of the current iteration is, and which references were dropped.
    A Variable that is alive keeps its array: whoever holds it may read it (PoocH only drops
    the graph's own references, so the memory goes when the Variable does)."""

    state: str = "device"           # device | incoming (swap-in not yet waited) | host | freed
    #                                 | encoded (its encoded form holds it)
    transfer: Transfer | None = None
    broadcast: tuple | None = None  # a broadcast view's shape (its core is copied: device.py)
    dropped_node: bool = False
    dropped_retained: bool = False


class MapActions:
    """The maps of ``executor``'s iteration in progress (``slots``) and the actions on them."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        # a map the schedule left absent that a recompute reads is restored through this
        self.restore_absent: Callable[[int], None] = lambda tensor: None
        self.reset()

    def reset(self) -> None:
        """A new iteration: no map is known yet."""
        self.slots: dict[int, Slot] = {}
        self.retained_out: dict[int, tuple[int, int]] = {}   # tensor -> (its op, position)
        self.inputs_held: dict[int, Any] = {}    # network inputs a recompute chain reads
        self.blobs: dict[int, Any] = {}          # encoded form -> its array on the device
        self.layouts: dict[int, tuple] = {}      # encoded form -> the map's strides
        self.pending: dict[int, None] = {}       # swapped out, not yet released: copy order

    def hold_inputs_while(self, node: Any) -> None:
        """The network inputs a recompute chain reads go once ``node`` (the op whose backward
        ran first: the loss's) is gone: no later pass can run over the graph then, and a
        loop's ``del loss`` frees its batch as plain Chainer's does (held to the next forward,
        a plan that recomputes from the batch held one batch more after its last op than
        the profiling iterations, which swapped it: 38% over a user's MLP budget)."""
        if node is not None and self.inputs_held:
            weakref.finalize(node, self.inputs_held.clear)

    def inputs_go(self) -> None:
        """The iteration ended: its graph is spent (hooks/ended_graphs.py), so no recompute
        reads its inputs again. They go now, as the profiling iterations' batch went there,
        not when the loop drops the loss (kept to the next forward: one batch more through
        it than the plan measured, 900 bytes over a user's minimum); the next graph's go in
        a dict of their own, since the loss node's finalizer holds this one."""
        self.inputs_held.clear()
        self.inputs_held = {}

    @property
    def encoded(self) -> dict:
        """Encoded form -> how its map is encoded (the program's; {} without one)."""
        program = self.executor.program
        return program.encoded if program is not None else {}

    def twin_of(self, tensor: int) -> int | None:
        """The id of ``tensor``'s encoded form; None if the program does not encode it."""
        program = self.executor.program
        return None if program is None else program.twins.get(tensor)

    # ------------------------------------------------------------ references
    def node(self, tensor: int) -> Any:
        ref = self.executor.nodes.get(tensor)
        return None if ref is None else ref()

    def _retained_by(self, tensor: int) -> tuple[Any, int] | None:
        """(the function node, position) of ``tensor`` among its producer's retained outputs."""
        where = self.retained_out.get(tensor)
        if where is None:
            return None
        function = self.executor.functions[where[0]]()
        return None if function is None else (function, where[1])

    def array_of(self, tensor: int) -> Any:
        """The tensor's array if any reference still holds it, else None."""
        if tensor in self.encoded:
            return self.blobs.get(tensor)
        node = self.node(tensor)
        if node is not None:
            if node_array(node) is not None:
                return node_array(node)
            variable = node.get_variable_or_none()
            if variable is not None and variable_array(variable) is not None:
                return variable_array(variable)
        retained = self._retained_by(tensor)
        if retained is not None:
            data = retained_outputs(retained[0])
            if data is not None and data[retained[1]] is not None:
                return data[retained[1]]
        return self.inputs_held.get(tensor)

    def held_by_variable(self, tensor: int) -> Any:
        node = self.node(tensor)
        variable = None if node is None else node.get_variable_or_none()
        return None if variable is None else variable_array(variable)

    def graph_refers(self, tensor: int) -> bool:
        """Whether the graph still has a node or a function that would read ``tensor``."""
        return self.node(tensor) is not None or self._retained_by(tensor) is not None

    def drop(self, tensor: int, slot: Slot) -> None:
        if tensor in self.encoded:
            self.blobs.pop(tensor, None)
            return
        node = self.node(tensor)
        if node is not None and node_array(node) is not None:
            set_node_array(node, None)
            slot.dropped_node = True
        retained = self._retained_by(tensor)
        if retained is not None:
            function, position = retained
            data = retained_outputs(function)
            if data is not None and data[position] is not None:
                set_retained_outputs(function, data[:position] + (None,) + data[position + 1:])
                slot.dropped_retained = True

    def restore(self, tensor: int, slot: Slot, array: Any) -> None:
        if tensor in self.encoded:
            self.blobs[tensor] = array
            self.executor.device.track(array, tensor)
            return
        node = self.node(tensor)
        if slot.dropped_node and node is not None:
            set_node_array(node, array)
        if slot.dropped_retained:
            retained = self._retained_by(tensor)
            if retained is not None:
                function, position = retained
                data = retained_outputs(function)
                set_retained_outputs(function, data[:position] + (array,) + data[position + 1:])
        slot.dropped_node = slot.dropped_retained = False
        self.executor.register_array(array, tensor)
        self.executor.device.track(array, tensor)

    def absent_bytes(self) -> int:
        """Bytes of the iteration's maps not on the device now (on the host, freed, encoded)."""
        tensors = self.executor.trace.tensors
        return sum(nbytes_of(tensors[t].shape, tensors[t].dtype) for t, slot in self.slots.items()
                   if slot.state in ("host", "freed", "encoded"))

    def slot(self, tensor: int) -> Slot:
        slot = self.slots.get(tensor)
        if slot is None:
            slot = self.slots[tensor] = Slot()
        return slot

    # ------------------------------------------------------------ the actions
    def timed_act(self, action: str, tensor: int, final: bool, boundary: int) -> None:
        """``act``, logged at ``boundary`` with its host seconds and whether it waited for a
        copy (not logged where it had nothing to do)."""
        waits, start = not self.landed(action, tensor), time.perf_counter()
        if self.act(action, tensor, final):
            self.executor.log_action(action, tensor, boundary, time.perf_counter() - start,
                                     waits)

    def act(self, action: str, tensor: int, final: bool) -> bool:
        """Do a schedule's action; False where it had nothing to do (a release of a map
        ``make_room`` released already), so that it is not logged twice."""
        if action == "swap_out":
            self.swap_out(tensor)
        elif action == "release":
            return self.release(tensor)
        elif action == "swap_in":
            self.swap_in(tensor)
        elif action == "wait":
            self.wait(tensor)
        elif action == "recompute":
            self.recompute(tensor)
        elif action == "free":
            self.free(tensor, final)
        elif action == "encode":
            self.encode(tensor)
        elif action == "decode":
            self.decode(tensor)
        else:
            raise ExecutorError(f"unknown action {action!r}")
        return True

    def swap_out(self, tensor: int) -> None:
        executor = self.executor
        slot = self.slot(tensor)
        array = self.array_of(tensor)
        if array is None:
            raise ExecutorError(f"swap_out of tensor {tensor}: no reference holds its array")
        if slot.transfer is not None and slot.transfer.source is array:
            return      # this very array's copy is under way (a schedule that then deviated)
        if slot.transfer is not None:
            executor.device.discard(slot.transfer)
        core, slot.broadcast = broadcast_core(array)
        slot.transfer = executor.device.swap_out(core, executor.timed_transfers)
        self.pending[tensor] = None
        if executor.timed_transfers:
            executor.stats.transfers.append((tensor, slot.transfer))
        executor.stats.swap_outs += 1

    def release(self, tensor: int) -> bool:
        """Wait for the map's swap-out, then drop it; False where ``make_room`` did already."""
        slot = self.slot(tensor)
        if slot.transfer is None:
            raise ExecutorError(f"release of tensor {tensor} before its swap-out")
        if slot.state == "host" and tensor not in self.pending:
            return False
        self.executor.device.finish_swap_out(slot.transfer)
        self.drop(tensor, slot)
        self.pending.pop(tensor, None)
        slot.state = "host"
        return True

    def make_room(self, index: int) -> None:
        """Before forward op ``index`` of a scheduled iteration: where what the device holds
        and the op's own peak in the plan would pass the budget, release swapped-out maps no
        later forward op reads, in the order their copies began, waiting for each copy, as
        the simulator does where an op would not fit. A graph that holds a little more than
        the planned one (a GRU given the state the first iteration made, its first run under
        the first graph's program with slow copies) stays within the budget where the copies
        under way allow: it went 5.7 KB over, and each refusal's minimum 5.7 KB higher."""
        executor = self.executor
        device, program = executor.device, executor.program
        budget = getattr(device, "budget", None)
        if executor.mode != SCHEDULED or budget is None or index >= len(program.op_peaks):
            return
        over = device.used_bytes() + program.op_peaks[index] - budget
        for tensor in [t for t in self.pending if program.last_read.get(t, -1) < index
                       and self.slot(t).state == "device"]:
            if over <= 0:
                return
            before = device.used_bytes()
            self.timed_act("release", tensor, False, index)
            executor.stats.room_releases += 1
            over -= before - device.used_bytes()

    def swap_in(self, tensor: int) -> None:
        executor = self.executor
        slot = self.slot(tensor)
        if slot.transfer is None or slot.state != "host":
            raise ExecutorError(f"swap_in of tensor {tensor}: it is not on the host")
        held = self.held_by_variable(tensor)
        if held is not None:          # the caller's Variable kept it: no copy needed
            self.restore(tensor, slot, held)
            slot.state = "device"
            executor.stats.swap_ins += 1
            return
        array = executor.device.swap_in(slot.transfer, executor.timed_transfers)
        if slot.broadcast is not None:      # a view of the copy: it sees the copy land
            array = get_array_module(array).broadcast_to(array, slot.broadcast)
        self.restore(tensor, slot, array)
        slot.state = "incoming"
        executor.stats.swap_ins += 1

    def wait(self, tensor: int) -> None:
        slot = self.slot(tensor)
        if slot.state == "incoming":
            self.executor.device.wait_swap_in(slot.transfer)
            slot.state = "device"

    def recompute(self, tensor: int) -> None:
        executor = self.executor
        slot = self.slot(tensor)
        program = executor.program
        chain = program.chains.get(tensor) if program is not None else None
        if not chain:       # kept, freed after its last use, and its ops cannot run again
            raise SpentGraphError(
                f"backward() needs tensor {tensor} again, which PoocH freed after its last use "
                "(no backward pass the first iterations showed reads it later) and cannot "
                "rebuild exactly (its forward ops cannot run again bit for bit); a loop that "
                "runs a second backward() over a graph should run it in every iteration, "
                "where PoocH keeps what it reads")
        values: dict[int, Any] = {}
        for k in chain:
            function = executor.functions[k]() if k < len(executor.functions) else None
            if function is None:
                raise ExecutorError(f"recompute of tensor {tensor}: forward op {k} is gone")
            if (changed := executor.update_stamps.changed_input(function)) is not None:
                raise SpentGraphError(
                    f"backward() needs a map of {type(function).__name__} again after an "
                    f"update changed its parameter {getattr(changed, 'name', None)!r}: PoocH "
                    "freed the map after its last use and would rebuild it from the updated "
                    "parameter, where plain Chainer reads what the forward saved; run every "
                    "backward over a graph before the update, or compute the loss again")
            inputs = []
            for node in function.inputs:
                tag = getattr(node, TAG, None)
                if tag is None or tag[0] is not executor._serial:      # a parameter
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
            for t, array in zip(executor.trace.ops[k].outputs, outputs):
                values[t] = array
        self.restore(tensor, slot, values[tensor])
        slot.state = "device"
        executor.stats.recomputes += 1

    def _present(self, source: int, target: int) -> Any:
        """A recompute source's array; a source the schedule left absent is restored now."""
        slot = self.slots.get(source)
        if slot is not None and slot.state != "device":
            self.restore_absent(source)
        array = self.array_of(source)
        if array is None:
            raise ExecutorError(f"recompute of tensor {target}: source {source} is not on the device")
        return array

    def free(self, tensor: int, final: bool) -> None:
        # the host copy (if any) stays until the iteration ends: a later backward pass over
        # the same graph may need the map again
        slot = self.slot(tensor)
        self.drop(tensor, slot)
        slot.state = "host" if final and slot.transfer is not None else "freed"
        self.executor.stats.frees += 1

    def encode(self, tensor: int) -> None:
        """Store ``tensor`` in its encoded form and drop the graph's references to it."""
        twin = self._twin(tensor, "encode")
        array = self.array_of(tensor)
        if array is None:
            raise ExecutorError(f"encode of tensor {tensor}: no reference holds its array")
        blob = codecs.encode(self.encoded[twin].codec, array)
        self.layouts[twin] = tuple(array.strides)
        self.restore(twin, self.slot(twin), blob)
        self.slot(twin).state = "device"
        slot = self.slot(tensor)
        self.drop(tensor, slot)
        slot.state = "encoded"
        self.executor.stats.encodes += 1

    def decode(self, tensor: int, keep_encoded: bool = False) -> None:
        """Put ``tensor`` back from its encoded form, which then goes (unless
        ``keep_encoded``: a restore outside the schedule, which drops the map again after)."""
        twin = self._twin(tensor, "decode")
        twin_slot = self.slot(twin)
        if twin_slot.state == "host":
            self.swap_in(twin)
        self.wait(twin)
        blob = self.blobs.get(twin)
        if blob is None:
            raise ExecutorError(f"decode of tensor {tensor}: its encoded form is gone")
        shape, dtype = self.executor.trace.tensors[tensor].shape, \
            self.executor.trace.tensors[tensor].dtype
        codec = self.encoded[twin].codec
        array = codecs.decode(codec, blob, shape, dtype, self.layouts.get(twin))
        slot = self.slot(tensor)
        self.restore(tensor, slot, array)
        if codec == "binarize":
            retained = self._retained_by(tensor)
            if retained is not None:       # the ReLU that made it; gone: no backward to run
                read_mask(retained[0])
        slot.state = "device"
        if not keep_encoded:
            self.drop(twin, twin_slot)
            twin_slot.state = "host" if twin_slot.transfer is not None else "freed"
        self.executor.stats.decodes += 1

    def _twin(self, tensor: int, action: str) -> int:
        twin = self.twin_of(tensor)
        if twin is None:
            raise ExecutorError(f"{action} of tensor {tensor}: the program does not encode it")
        return twin

    def landed(self, action: str, tensor: int) -> bool:
        """Whether ``action`` finds the copy it may wait for already landed (nothing to wait)."""
        slot = self.slots.get(tensor)
        device = self.executor.device
        if action == "release" and slot is not None and slot.transfer is not None:
            return device.landed(slot.transfer, "out")
        if action == "wait" and slot is not None and slot.state == "incoming":
            return device.landed(slot.transfer, "in")
        return True

    # ------------------------------------------------------------ bookkeeping
    def discard_copies(self) -> None:
        """Let go of every host copy (the iteration, or its forward-only pass, is over)."""
        for slot in self.slots.values():
            if slot.transfer is not None:
                self.executor.device.discard(slot.transfer)
                slot.transfer = None

    def compact(self, n_ops: int, n_tensors: int) -> None:
        """The first ``n_ops`` ops and ``n_tensors`` tensors left the iteration (a leading
        forward-only pass; its maps were restored): forget them, renumber the rest."""
        for tensor in [t for t in self.slots if t < n_tensors]:
            slot = self.slots.pop(tensor)
            if slot.transfer is not None:
                self.executor.device.discard(slot.transfer)
        self.slots = {t - n_tensors: v for t, v in self.slots.items() if t >= n_tensors}
        self.inputs_held = {t - n_tensors: v for t, v in self.inputs_held.items()
                            if t >= n_tensors}
        self.retained_out = {t - n_tensors: (k - n_ops, p) for t, (k, p)
                             in self.retained_out.items() if t >= n_tensors and k >= n_ops}
