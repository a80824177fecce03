"""Executor: replay a plan's schedule inside a real Chainer iteration (DESIGN.md, "Executing
a plan inside Chainer").

The executor is a GraphRecorder, so it sees the same op indices and tensor ids as the profile
the plan was made from. At every op boundary it runs the schedule's actions for that boundary
(hooks/map_actions.py does them). Forward boundary b runs when op b begins; backward boundary
j+1 as backward op j ends, so frees happen early (its recomputes as op j+1 begins).

Modes (``mode``): *scheduled* while it follows its program; *on demand* without a program
(the first profiling iteration) or once its graph deviated (checked at every op; PoocH
re-profiles; hooks/ondemand.py decides); *passive* for a loop PoocH cannot plan (every
dropped map comes back). A profiler is attached while profiling.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer

from pooch_ext.hooks.ended_graphs import guard_spent, let_go, refuse_stale_backward
from pooch_ext.hooks.update_stamps import UpdateStamps
from pooch_ext.hooks.function_nodes import TAG, hand_back_inputs, take_back_inputs
from pooch_ext.hooks.graph import GraphRecorder
from pooch_ext.hooks.inplace_relu import alone, as_chainer, write_over_input
from pooch_ext.hooks.iteration_stats import IterationStats
from pooch_ext.hooks.map_actions import MapActions
from pooch_ext.hooks.model_state import base_of, made_apart, model_arrays, not_apart
from pooch_ext.hooks.ondemand import OnDemand
from pooch_ext.hooks.views import compact
from pooch_ext.hooks.program import ON_DEMAND, PASSIVE, SCHEDULED, Program
from pooch_ext.hooks.split_conv import ConvSplit, split, whole_backward
from pooch_ext.hooks.split_exact import KNOWN
from pooch_ext.hooks.runtime_device import RuntimeDevice
from pooch_ext.trace import GraphTrace

if TYPE_CHECKING:
    from pooch_ext.hooks.profiler import Profiler

# where the device checks what ran after an iteration's last op (the update, the loop's code)
AFTER_LAST_OP = "the step after the iteration's last op"


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
        if model is not None:       # counted from the start: what runs before the first op too
            device.note_resident(model)
        self.program: Program | None = None
        self.on_deviation, self.link_added = on_deviation, link_added
        self.iteration_done, self.backward_done = iteration_done, backward_done
        self.on_unsupported_run: Callable[[str], None] | None = None
        self.catalog: Callable[[], list[Program]] = lambda: []   # programs to switch to
        self.on_switch: Callable[[Program], None] | None = None
        self.passive = False        # this iteration runs as plain Chainer: nothing is dropped
        self._enforce_after = False  # the device's budget is off for this iteration only
        self._in_data: tuple = ()
        self._over_input: Any = None     # the function now writing over its input, if any
        # (function, its input arrays) -> (forward, backward) pieces (or None) a convolution runs
        # in where no program governs the maps (a first iteration; backprop off: an evaluation)
        self.on_demand_split: Callable[[Any, tuple], tuple[int, int] | None] | None = None
        self.unrecorded_split: Callable[[Any, tuple], tuple[int, int] | None] | None = None
        # (that function, its incoming gradients, its pieces) as its backward begins: the
        # pieces it then runs in, its backward's chosen there, before the op's clock starts
        self.on_demand_backward: Callable[[Any, tuple, tuple], tuple[int, int]] | None = None
        self._out_grad: tuple = ()       # the backward op's incoming gradients, while it begins
        self.profiler: Profiler | None = None     # attached while profiling (its attach())
        self.history: list[IterationStats] = []
        self.stats = IterationStats(-1)
        self.deviation = ""
        self.maps = MapActions(self)
        self.update_stamps = UpdateStamps()      # rebuilds refused after an update (its module)
        self.on_demand = OnDemand(self)
        self.maps.restore_absent = self.on_demand.restore
        self._next_boundary = self._next_action = 0
        self.head_peak = self._head_functions = self._forward_only_peak = 0   # (peaks before)
        self.kept_forward = False   # maps of a forward without backward the loop refers to
        self._pending_in_data: tuple | None = None
        self._input_bases: set[int] = set()
        self._lazy: list = []          # parameters not made yet (lazily initialised links)
        # this iteration's schedule, as (boundary, action, tensor, host seconds, whether it
        # waited for a copy); seconds NaN where not timed (on demand)
        self.executed: list[tuple[int, str, int, float, bool]] = []
        self._queued: tuple | None = None

    def use(self, program: Program | None) -> None:
        """Replay ``program`` from the next iteration on (None: work on demand only)."""
        self._queued = (program,)

    def __exit__(self, *exc: Any) -> None:
        for param in self._lazy:        # never made under PoocH: made as Chainer makes it
            not_apart(param)
        super().__exit__(*exc)
        guard_spent(self.functions)

    def abandon(self, restore: bool = False) -> None:
        """Forget the iteration in progress (after an error): nothing more is run for it.
        ``restore`` (a refusal): what it swapped of a graph the loop still refers to comes
        back first, as plain Chainer's graph is whole there (an LSTM's state leads into it)."""
        if restore and self.trace is not None:
            self.on_demand.restore_all(copies_only=True)
        self.trace = self._pending = None

    @property
    def timed_transfers(self) -> bool:
        """Copies are timed while a profiler is attached (it reads their times)."""
        return self.profiler is not None

    @property
    def mode(self) -> str:
        """How the iteration in progress treats its maps: SCHEDULED, ON_DEMAND or PASSIVE."""
        return PASSIVE if self.passive else \
            ON_DEMAND if self.program is None or self.deviation else SCHEDULED

    # ------------------------------------------------------------ the schedule
    def _run_until(self, boundary: int, recomputes: bool = True) -> None:
        """Run the program's actions of every boundary up to and including ``boundary``; of
        ``boundary`` only those before its first recompute or decode if not ``recomputes``:
        those run as their op begins, beside what the backward loop holds between ops there
        (what the profile measures), not as the op before ends, while the loop still holds
        that op's inputs and gradients too (a user's recomputing plan went 4.6% over its
        budget; a sparse map's decode before a ReLU's backward 12.4%)."""
        while self._next_boundary <= boundary:
            b = self._next_boundary
            for action, tensor, final in (self.program.actions.get(b, [])[self._next_action:]
                                          if self.mode == SCHEDULED else ()):
                if action in ("recompute", "decode") and not recomputes and b == boundary:
                    return
                self.maps.timed_act(action, tensor, final, b)
                self._next_action += 1
            self._next_boundary, self._next_action = b + 1, 0

    def log_action(self, action: str, tensor: int, boundary: int | None = None,
                   seconds: float = float("nan"), waited: bool = False) -> None:
        """Note an action done to a feature map at ``boundary`` (default: the one just run),
        with the host seconds it took when timed and whether it waited for a copy."""
        self.executed.append((self._next_boundary - 1 if boundary is None else boundary,
                              action, tensor, seconds, waited))

    def _deviate(self, reason: str) -> None:
        if self.deviation or not reason:
            return
        self.deviation = self.stats.deviation = reason
        self._unbudgeted()
        for op in self.trace.ops:     # from now on, anything retained may go once unreferenced
            self.on_demand.watch(self.on_demand.retained(op))
        if self.on_deviation is not None:
            self.on_deviation(reason)

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

    # ------------------------------------------------------------ passive iterations
    def _go_passive(self) -> None:
        if not self.passive:
            self.passive = True
            self._unbudgeted()
            self.on_demand.restore_all()

    def _unbudgeted(self) -> None:
        """The rest of the iteration runs without a plan: no budget was planned for it, so the
        device does not stop training over it (a refusal after updates would break the
        promise); where it reports overruns instead (``on_overrun``), it still does."""
        if getattr(self.device, "enforce", False) and \
                getattr(self.device, "on_overrun", None) is None:
            self.device.enforce = False
            self._enforce_after = True

    # ------------------------------------------------------------ GraphRecorder hooks
    def forward_preprocess(self, function: Any, in_data: tuple) -> None:
        self.update_stamps.stamp(function)
        if self.iteration < 0 and not chainer.config.enable_backprop:
            self._head_functions += 1          # before the first op (``head_peak``)
        self._in_data = in_data
        try:
            super().forward_preprocess(function, in_data)
        finally:
            self._in_data = ()
        if self.unrecorded_split is not None and not chainer.config.enable_backprop and \
                not self._in_backward and not self.paused:
            if (pieces := self.unrecorded_split(function, in_data)) is not None:
                split(function, ConvSplit(pieces[0], pieces[1], pieces[1]), KNOWN)

    def forward_postprocess(self, function: Any, in_data: tuple) -> None:
        if self._over_input is function:   # an in-place forward is for this one run only
            as_chainer(function)
            self._over_input = None
        if self.profiler is not None:
            self.profiler.forward_function_done(function)
        super().forward_postprocess(function, in_data)
        if self._pending is not None and self._pending[1] is function:
            self._pending_in_data = in_data

    def backward_preprocess(self, function: Any, in_data: tuple, out_grad: tuple) -> None:
        self._out_grad = out_grad
        try:
            super().backward_preprocess(function, in_data, out_grad)
            hand_back_inputs(function)
        finally:
            self._out_grad = ()

    def backward_postprocess(self, function: Any, in_data: tuple, out_grad: tuple) -> None:
        take_back_inputs(function)
        if self.profiler is not None and self._in_backward:
            self.profiler.backward_function_done()
        super().backward_postprocess(function, in_data, out_grad)

    def on_iteration_start(self) -> None:
        if self._enforce_after:
            self.device.enforce, self._enforce_after = True, False
        if self._queued is not None:
            self.program, self._queued = self._queued[0], None
        self.stats = IterationStats(self.iteration, self.program.label if self.program else "")
        self.deviation = ""
        self.passive = False
        self.maps.reset()
        self.on_demand.reset()
        self._input_bases, self.executed = set(), []
        self._next_boundary = self._next_action = 0
        if self.model is not None and (self.iteration < 4 or self.iteration % 64 == 0):
            # gradients and optimizer state count from the start, a parameter a lazy link
            # makes on its first call from then (on_forward_resolved)
            self.device.note_resident(self.model)
            self._lazy = [p for p in self.model.params() if p.array is None]
            apart = getattr(getattr(self.device, "counter", None), "apart", None)
            for param in self._lazy if apart is not None else ():
                made_apart(param, apart)
        if self.program is None:
            self._unbudgeted()              # nothing planned this iteration's memory
        # before the first op: what ran since PoocH began, if functions did (a teacher's
        # forward runs again; data made with NumPy may not: PoocH._check_first_tail sees)
        self.head_peak = int(self.device.peak) if self.iteration == 0 and self._head_functions else 0
        self.device.reset_peak()
        self.stats.started = time.perf_counter()
        if self.profiler is not None:
            self.profiler.iteration_started()

    def on_pass_start(self, index: int, function: Any, in_data: tuple) -> bool:
        """A new forward pass before any backward: if a plan's graph starts here (and the
        plan being run does not go on here), what ran so far was a forward-only pass."""
        if self.program is None or self.passive:
            return False
        sources = [None] * len(in_data)
        name = type(function).__name__
        if (not self.deviation and not self.program.matches(index, name, sources, in_data)) \
                or (self.deviation and self.on_demand.held_by_the_loop()):
            return False
        for candidate in [self.program] + self.catalog():
            if not candidate.matches(0, name, sources, in_data):
                self.program = candidate
                self._queued = None
                return True
        return False

    def on_forward_only(self, trace: GraphTrace) -> None:
        self._forward_only_peak = max(self._forward_only_peak, int(self.device.peak))
        self.kept_forward |= self.on_demand.restore_all() > 0   # (a skipped batch's graph)
        self.maps.discard_copies()
        if self.profiler is not None:
            self.profiler.forward_only_dropped()

    def on_compact(self, n_ops: int, n_tensors: int) -> None:
        self.on_demand.restore_all({t for t in self.maps.slots if t < n_tensors})
        self.maps.compact(n_ops, n_tensors)
        self.on_demand.compact(n_tensors)
        self.executed = [(b - n_ops, a, t - n_tensors, s, w) for b, a, t, s, w in self.executed
                         if t >= n_tensors and b >= n_ops]
        if self.profiler is not None:
            self.profiler.compacted(n_ops, n_tensors)

    def on_unsupported(self, reason: str) -> None:
        self._go_passive()
        if self.on_unsupported_run is not None:
            self.on_unsupported_run(reason)

    def on_forward_begin(self, index: int, function: Any) -> None:
        if self.mode == SCHEDULED:
            name = type(function).__name__
            reason = self.program.matches(index, name, self.op_sources, self._in_data)
            if reason and not self._switch(index, name):
                self._deviate(reason)
        self._run_until(index)
        self.maps.make_room(index)      # (a scheduled iteration's op that would not fit)
        # split where measured exact only: an in-op probe's scratch is in no plan (H200 OOM)
        pieces = None
        if self.mode == SCHEDULED:
            pieces = self.program.splits.get(index)
        elif self.mode == ON_DEMAND and self.on_demand_split is not None:
            pieces = self.on_demand_split(function, self._in_data)
        if self.mode == SCHEDULED and index in self.program.inplace:
            self._write_over_input(index, function)
        if pieces is not None:
            # the node's backward runs in its pieces too: split installs both on it here
            forward, backward = pieces
            split(function, ConvSplit(forward, backward, backward), KNOWN)
            self.stats.splits[index] = (forward, backward)
        if self.mode == ON_DEMAND:
            self.on_demand.release_unreferenced()
        self.device.check("forward op", index, function)
        if self.profiler is not None:
            self.profiler.forward_began(index)

    def _write_over_input(self, index: int, function: Any) -> None:
        """Op ``index`` writes its output over its input, as planned, if nothing else refers
        to the input now; else it runs as Chainer's and the plan no longer holds."""
        if alone(self._in_data):
            write_over_input(function)
            self._over_input = function
            self.stats.inplace += 1
        else:
            self._deviate(f"forward op {index} ({type(function).__name__}) was to write over "
                          "its input, but something else refers to that array now")

    def on_forward_resolved(self, index: int, function: Any) -> None:
        if self._lazy and any(p.array is not None for p in self._lazy):   # made by this op
            self.device.note_resident(self.model)
            self._lazy = [p for p in self._lazy if p.array is None]
        op = self.trace.ops[index]
        in_data, self._pending_in_data = self._pending_in_data, None
        # a profiler times the op's recomputation on its inputs (and holds them until then)
        rerun_inputs = in_data if self.profiler is not None else None
        program, tensors, maps = self.program, self.trace.tensors, self.maps
        for node, array in zip(function.inputs or (), in_data or ()):
            tag = getattr(node, TAG, None)
            if tag is None or tag[0] is not self._serial or tensors[tag[1]].producer >= 0:
                continue
            # a network input is the caller's (a batch the data set may keep): views of it,
            # such as a reshape, hold no device memory of the iteration's own
            self._input_bases.add(id(base_of(array)))
            if program is not None and tag[1] in program.input_sources:
                maps.inputs_held[tag[1]] = array
        del in_data     # the op's inputs are not ours to hold (memory counted below)
        for t in dict.fromkeys(op.inputs[p] for p in op.retain_inputs):
            compact(maps.node(t), lambda key: key in self._input_bases or (
                self.model is not None and key in model_arrays(self.model)))
        for position, p in enumerate(op.retain_outputs):
            maps.retained_out[op.outputs[p]] = (index, position)
        for t in op.outputs:
            array = maps.array_of(t)
            if array is not None and id(base_of(array)) not in self._input_bases:
                self.device.track(array, t)
        if self.mode == SCHEDULED:
            self._deviate(program.resolved_differs(self.trace, index))
        if self.mode == ON_DEMAND:
            self.on_demand.watch(self.on_demand.retained(op))
        self.device.check("forward op", index, function)
        if self.profiler is not None:
            self.profiler.forward_resolved(index, function, rerun_inputs)

    def on_backward_begin(self, index: int, fwd_index: int, function: Any) -> None:
        if self.mode == SCHEDULED:
            self._deviate(self.program.backward_differs(self.trace, index, fwd_index))
        self._run_until(index)
        if self.mode == ON_DEMAND:
            self.on_demand.release_unreferenced()
        self.on_demand.restore_for(fwd_index)
        self.device.check("backward op", index, function)
        if (self.mode == ON_DEMAND and fwd_index in self.stats.splits
                and self.on_demand_backward is not None):
            ran = self.stats.splits
            ran[fwd_index] = self.on_demand_backward(function, self._out_grad, ran[fwd_index])
        if self.profiler is not None:
            self.profiler.backward_began(index, fwd_index, self._out_grad)

    def on_backward_end(self, index: int, fwd_index: int, function: Any) -> None:
        self.on_demand.put_back(index + 1)
        self._run_until(index + 1, recomputes=False)
        self.device.check("backward op", index, function)
        self.stats.finished = time.perf_counter()

    def on_revisit_begin(self, fwd_index: int, function: Any) -> None:
        """A later backward pass runs op ``fwd_index`` again: it finds what it reads (kept
        there, as plain Chainer would, until the iteration ends), and runs whole: what the
        first iteration measures of it is then what a planned one holds (the first one's
        on-demand splits lowered a later pass's peak by 0.67 MB, 39%, below a plan's)."""
        whole_backward(function)
        if self.profiler is not None:
            self.profiler.revisit_began()
        self.on_demand.restore_for(fwd_index)
        self.on_demand.after_op = []
        if self.profiler is not None:
            self.profiler.revisit_restored()

    def on_new_link(self, link: Any) -> None:
        self.device.note_resident(self.model)
        if self.link_added is not None:
            self.link_added(link)

    def settled(self, trace: GraphTrace) -> GraphTrace:
        """``trace`` (this iteration's, in progress) settled as its end would settle it."""
        return self._holding.settled(trace)

    def _drop_node_state(self, trace: GraphTrace) -> None:
        """The ended iteration's nodes let go of what they kept (hooks/ended_graphs.py); not
        while a backward pass still runs, nor after an unsupported iteration (double backprop:
        a gradient's product can begin what looks like the next iteration while it is read)."""
        if not self._pass_depth and not trace.unsupported:
            let_go(self.functions, trace.backward_ran)

    def on_stale_backward(self, function: Any) -> None:
        refuse_stale_backward(function)

    def on_backward_complete(self, trace: GraphTrace) -> None:
        first = trace.backward_order[0] if trace.backward_order else -1   # the loss's op
        self.maps.hold_inputs_while(self.functions[first]() if first >= 0 else None)
        if self.profiler is not None:
            self.profiler.backward_complete()
        if self.backward_done is not None:
            self.backward_done(trace)

    def on_iteration_end(self, trace: GraphTrace) -> None:
        self.device.check(AFTER_LAST_OP)    # later backward passes, the update, the loop
        self._drop_node_state(trace)
        if self.profiler is not None:
            self.profiler.iteration_ending()
        if self.mode == SCHEDULED:
            self._deviate(self.program.end_differs(trace))
            if not self.deviation:
                self._run_until(self.program.n_ops)
        self.maps.discard_copies()
        self.maps.inputs_go()
        self.on_demand.candidates = []
        self.stats.peak_bytes, self._forward_only_peak, self.kept_forward = max(
            int(self.device.peak), self._forward_only_peak), 0, False
        self.history.append(self.stats)
        if self.profiler is not None:
            self.profiler.collect(trace)
        self.stats.transfers = []
        if self.iteration_done is not None:
            self.iteration_done(trace)
