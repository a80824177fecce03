"""GraphRecorder: what Chainer really runs in one training iteration, as plain data.

A FunctionHook (plus a LinkHook for names) that records, per iteration, every forward
function in execution order (its activation inputs and outputs, parameter shapes, which
inputs / outputs it retains for backward, scalar attributes such as stride and pad) and the
order in which backward visits them. The analytic tracer turns that into a Profile with the
cost model; the executor subclasses it to act at op boundaries (and the profiler, attached to
the executor, times them), so all three agree on op indices and tensor ids.

Facts of Chainer 7 this relies on (DESIGN.md):
* ``forward_postprocess`` runs before the outputs are wrapped and before retention is
  recorded, so an op is *resolved* (outputs, retained indexes) at the next hook call (a
  user's ``unchain_backward()`` in between leaves nothing to resolve: declined);
* functions applied inside a backward (Convolution2DGradW, ...) belong to that backward op;
* nothing is recorded while ``enable_backprop`` is off (evaluation, recomputation);
* Chainer has no hook for a backward pass's start and end: its entry points are wrapped
  while a recorder is entered (hooks/backward_passes.py; this tells double backprop too);
* a VariableNode keeps only a weak reference to its Variable, so a weakref callback on the
  Variable tells when the caller's code let go of a tensor (``TensorRecord.held_until``).

Tensor ids are in creation order (network inputs when first consumed), as ``ProfileBuilder``
makes them, so ``GraphTrace.to_builder`` reproduces them exactly.
"""
from __future__ import annotations

import weakref
from typing import Any

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer

from pooch_ext.hooks.backward_passes import listen, unlisten
from pooch_ext.hooks.chainer_refs import retained_indexes, variable_array
from pooch_ext.hooks.function_nodes import (TAG, ancestors, count_backward_ops,
                                            is_static_graph, scalar_attrs)
from pooch_ext.hooks.holding import HoldingWatch
from pooch_ext.hooks.inplace_relu import alone
from pooch_ext.hooks.link_names import LinkNames
from pooch_ext.inplace import FUNCTIONS as INPLACE_FUNCTIONS
from pooch_ext.trace import GraphTrace, OpRecord, ParamRecord, TensorRecord

TAIL = -1             # op index of a function run on the graph after its first backward pass


class GraphRecorder(chainer.FunctionHook):
    """Record each training iteration's graph; subclasses act at op boundaries.

    Use as a context manager around training (``with GraphRecorder(model) as rec: ...``).
    ``rec.traces`` holds one GraphTrace per completed iteration (``keep_traces`` of them).

    What an iteration is: the forward ops up to the first backward pass over them, that pass,
    and whatever else runs on the same graph (``tail`` forward ops that read its tensors, such
    as a second loss, and further backward passes, which are counted in ``passes`` and
    ``revisited``). The next forward op that reads none of the graph's tensors starts the next
    iteration. A forward pass that backward never reaches (validation, a metric, an action
    chosen with backprop on) is not part of it: when the first backward pass begins, leading
    passes that the loss does not depend on are dropped from the trace (``on_compact``).

    Subclass hooks (all no-ops here): ``on_iteration_start``, ``on_forward_begin(k, fn)``,
    ``on_forward_resolved(k, fn)``, ``on_backward_begin(j, k, fn)``,
    ``on_backward_end(j, k, fn)``, ``on_backward_complete(trace)`` (the first backward pass
    is over: the moment before the optimizer update), ``on_revisit_begin(k, fn)`` /
    ``on_revisit_end(k, fn)`` (a later pass runs op k's backward again),
    ``on_pass_start(k, fn)`` (op k starts a new forward pass before any backward: return True
    to treat what came before as a forward-only pass and start afresh), ``on_compact(p, t)``,
    ``on_unsupported(reason)``, ``on_new_link(link)``, ``on_iteration_end(trace)``.
    """

    name = "PoochGraphRecorder"
    record_attrs = True    # subclasses that never read OpRecord.attrs may skip collecting them

    def __init__(self, model: Any = None, keep_traces: int = 8) -> None:
        self.model, self.keep_traces, self.iteration = model, keep_traces, -1
        # parameters with a gradient as recording began (ParamRecord.cleared_before_forward)
        self._graded = set() if model is None else {id(p) for p in model.params() if p.grad_var is not None}
        self.traces: list[GraphTrace] = []
        self.trace: GraphTrace | None = None
        self.functions: list[weakref.ref] = []      # op index -> FunctionNode (this iteration)
        self.nodes: dict[int, weakref.ref] = {}     # tensor id -> VariableNode (this iteration)
        self.paused, self.op_sources = False, []    # op_sources: tensor ids the op reads
        self._link_names = LinkNames(model, self._new_link)
        self._pending: tuple[int, Any] | None = None    # (op index, function) to resolve
        self._labels: list[str] = []
        self._in_backward: list[bool] = []          # per running backward op: of the first pass
        self._serial, self._n_inputs = object(), 0    # network inputs seen this iteration
        self._expected_backward = -1   # backward ops of an unsignalled pass, once known
        self._arrays: dict[int, tuple[weakref.ref, int]] = {}   # id(array) -> (ref, tensor)
        self._tensor_marks: list[int] = []          # op index -> tensors recorded before it
        self._pass_starts: list[int] = []           # forward ops that start a forward pass
        self._pass_depth, self._pass_visited = 0, False
        self._on_gradients = False   # after chainer.grad's double backprop: a penalty on them
        self._visited: set[int] = set()
        self._position = -1                         # the op running or last started
        self._holding = HoldingWatch(lambda: self._position)   # who still holds a tensor
        self._params: dict[int, tuple[int, weakref.ref]] = {}   # id(Parameter) -> (index, ref)

    # ------------------------------------------------------------ context
    def __enter__(self) -> "GraphRecorder":
        super().__enter__()
        self._link_names.__enter__()
        listen(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.finish()
        finally:
            unlisten(self)
            self._link_names.__exit__(*exc)
            super().__exit__(*exc)

    def finish(self) -> None:
        """Close the current iteration (called at exit; also usable after a manual loop)."""
        self._resolve()
        if self.trace is not None and self.trace.ops:
            self._end_iteration()
        self.trace = None

    def _new_link(self, link: chainer.Link) -> None:
        if self.model is not None and hasattr(self.model, "add") and self.model.add(link, held=False):
            self._link_names.refresh()
            self.on_new_link(link)

    # ------------------------------------------------------------ subclass hooks
    def on_new_link(self, link: chainer.Link) -> None: ...
    def on_iteration_start(self) -> None: ...
    def on_forward_begin(self, index: int, function: Any) -> None: ...
    def on_forward_resolved(self, index: int, function: Any) -> None: ...
    def on_backward_begin(self, index: int, fwd_index: int, function: Any) -> None: ...
    def on_backward_end(self, index: int, fwd_index: int, function: Any) -> None: ...
    def on_backward_complete(self, trace: GraphTrace) -> None: ...
    def on_revisit_begin(self, fwd_index: int, function: Any) -> None: ...
    def on_revisit_end(self, fwd_index: int, function: Any) -> None: ...
    def on_stale_backward(self, function: Any) -> None: ...
    def on_pass_start(self, index: int, function: Any, in_data: tuple) -> bool: return False
    def on_forward_only(self, trace: GraphTrace) -> None: ...
    def on_compact(self, n_ops: int, n_tensors: int) -> None: ...
    def on_unsupported(self, reason: str) -> None: ...
    def on_iteration_end(self, trace: GraphTrace) -> None: ...

    # ------------------------------------------------------------ chainer hooks
    def _recording(self) -> bool:
        return not self.paused and not self._in_backward and chainer.config.enable_backprop

    def forward_preprocess(self, function: Any, in_data: tuple) -> None:
        if not self._recording():
            return
        self._resolve()
        sources = self._sources(in_data)
        connected = any(s is not None for s in sources)
        if self.trace is None:
            self._start_iteration()
        elif self.trace.passes or self.trace.backward_order:
            if connected or self._on_gradients:   # a second loss on this graph, a penalty
                self._tail(function)
                return
            self._end_iteration()
            self._start_iteration()
        elif self.trace.ops and not connected:
            index = len(self.trace.ops)
            if self.on_pass_start(index, function, in_data):
                self._forget_forward_only()
            else:
                self._pass_starts.append(index)
        if is_static_graph(function):
            self._unsupported("@chainer.static_graph models keep their own references to every "
                              "array and replay them, out of PoocH's sight; use the model "
                              "without @static_graph under PoocH")
        index = len(self.functions)
        setattr(function, TAG, (self._serial, index))
        self.functions.append(weakref.ref(function))
        self._labels.append(self._link_names.stack[-1] if self._link_names.stack else "")
        self._alone.append(type(function).__name__ in INPLACE_FUNCTIONS and alone(in_data))
        self._tensor_marks.append(len(self.trace.tensors))
        self._position = index
        self.op_sources = sources
        self.on_forward_begin(index, function)

    def forward_postprocess(self, function: Any, in_data: tuple) -> None:
        tag = getattr(function, TAG, None)
        if not self._recording() or tag is None or tag[0] is not self._serial:
            return
        self._pending = (tag[1], function)

    def backward_preprocess(self, function: Any, in_data: tuple, out_grad: tuple) -> None:
        if self.paused:
            return
        self._resolve()
        tag = getattr(function, TAG, None)
        if tag is not None and tag[0] is not self._serial:
            self.on_stale_backward(function)      # a node of an iteration that has ended
        if tag is None or tag[0] is not self._serial or self.trace is None or tag[1] < 0:
            return
        k = tag[1]
        if self._pass_depth:
            self._pass_visited = True
        first = self.trace.passes == 0 and k not in self._visited
        self._in_backward.append(first)
        if not first:
            self.trace.revisited.add(k)
            self.on_revisit_begin(k, function)
            return
        if not self.trace.backward_order:
            for index in self.gradients_held():    # which parameters still hold a gradient
                self.trace.params[index].grad_in_backward = True
            if not self._pass_depth:
                self._expected_backward = count_backward_ops(function, self._serial)
        self._visited.add(k)
        self.trace.backward_order.append(k)
        self._position = self._backward_index()
        self.on_backward_begin(self._backward_index(), k, function)

    def backward_postprocess(self, function: Any, in_data: tuple, out_grad: tuple) -> None:
        tag = getattr(function, TAG, None)
        if self.paused or tag is None or tag[0] is not self._serial or not self._in_backward \
                or tag[1] < 0:
            return
        first = self._in_backward.pop()
        if not first:
            self.on_revisit_end(tag[1], function)
            return
        self.on_backward_end(self._backward_index(), tag[1], function)
        if not self._pass_depth and len(self.trace.backward_order) == self._expected_backward:
            self.trace.passes += 1            # an unsignalled pass: its predicted end
            self.on_backward_complete(self.trace)

    # ------------------------------------------------------------ backward passes
    def _pass_begin(self, nodes: list, double: bool, returned: bool = False) -> None:
        self._pass_depth += 1
        if self._pass_depth > 1 or self.trace is None or self.paused:
            return
        self._resolve()
        self._pass_visited, self._on_gradients = False, bool(double and returned)
        if not self.trace.ops:
            return
        if double:
            self._unsupported("double backprop (enable_double_backprop=True): the gradient "
                              "graph keeps references to feature maps that no plan accounts for")
        if self.trace.passes == 0 and not self.trace.backward_order:
            self._drop_forward_only_passes(nodes)

    def _pass_end(self, failed: bool) -> None:
        self._pass_depth -= 1
        if not self._pass_depth:    # the op a failed pass raised in never ended: else
            self._in_backward.clear()   # nothing would be recorded again (_recording)
        if self._pass_depth or self.trace is None or not self._pass_visited or self.paused:
            return
        self.trace.passes += 1
        self.trace.failed |= self.trace.passes == 1 and failed   # no iteration to learn from
        if self.trace.passes == 1 and not failed:
            self.on_backward_complete(self.trace)

    def _unsupported(self, reason: str) -> None:
        if self.trace is not None and not self.trace.unsupported:
            self.trace.unsupported = reason
            self.on_unsupported(reason)

    # ------------------------------------------------------------ forward-only passes
    def _drop_forward_only_passes(self, nodes: list) -> None:
        """Leading forward passes the loss does not depend on are no part of the iteration."""
        ancestors_ = ancestors(nodes, self._serial)
        if not ancestors_ or not self._pass_starts:
            return
        first = min(ancestors_)
        starts = [p for p in self._pass_starts if p <= first]
        if not starts:
            return
        n_ops = starts[-1]
        n_tensors = self._tensor_marks[n_ops]
        if any(t < n_tensors for op in self.trace.ops[n_ops:] for t in op.inputs):
            return          # a later op reads one of their tensors: they stay
        self._compact(n_ops, n_tensors)

    def _compact(self, n_ops: int, n_tensors: int) -> None:
        """Drop the first ``n_ops`` forward ops and ``n_tensors`` tensors; renumber the rest."""
        trace = self.trace
        self.on_compact(n_ops, n_tensors)
        dead = object()
        for ref in self.functions[:n_ops]:
            function = ref()
            if function is not None:
                setattr(function, TAG, (dead, -1))
        for tid in range(n_tensors):
            node = self.nodes.get(tid, lambda: None)()
            if node is not None:
                setattr(node, TAG, (dead, -1))
        trace.drop_leading(n_ops, n_tensors)
        tensors = trace.tensors
        self._holding.compact(n_ops)
        self.functions = self.functions[n_ops:]
        self._labels = self._labels[n_ops:]
        self._alone = self._alone[n_ops:]
        self._tensor_marks = [m - n_tensors for m in self._tensor_marks[n_ops:]]
        self._pass_starts = [p - n_ops for p in self._pass_starts if p > n_ops]
        self.nodes = {t - n_tensors: ref for t, ref in self.nodes.items() if t >= n_tensors}
        for k, ref in enumerate(self.functions):
            function = ref()
            if function is not None:
                setattr(function, TAG, (self._serial, k))
        for t, ref in self.nodes.items():
            node = ref()
            if node is not None:
                setattr(node, TAG, (self._serial, t))
        self._arrays = {key: (ref, t - n_tensors) for key, (ref, t) in self._arrays.items()
                        if t >= n_tensors or t == TAIL}
        self._n_inputs = sum(1 for record in tensors if record.producer < 0)
        for k, record in enumerate(t for t in tensors if t.producer < 0):
            record.output_index = k
        self._position -= n_ops

    def _forget_forward_only(self) -> None:
        """What ran so far was a forward-only pass: start the iteration afresh at this op."""
        self.on_forward_only(self.trace)
        self._start_iteration(count=False)

    # ------------------------------------------------------------ bookkeeping
    def _backward_index(self) -> int:
        return len(self.trace.ops) + len(self.trace.backward_order) - 1

    def _start_iteration(self, count: bool = True) -> None:
        if count:
            self.iteration += 1
        self.trace = GraphTrace()
        self.functions = []
        self._labels = []
        self._alone: list[bool] = []
        self.nodes = {}
        self._serial = object()
        self._n_inputs = 0
        self._expected_backward = -1
        self._arrays = {}
        self._tensor_marks = []
        self._pass_starts = []
        self._visited = set()
        self._position = -1
        self._holding.reset()
        self._params = {}
        self.on_iteration_start()

    def _end_iteration(self) -> None:
        trace = self.trace
        if not trace.backward_order and not trace.passes:
            self.on_forward_only(trace)         # no backward came: not an iteration
            self.iteration -= 1
            return
        self._holding.settle(trace)
        self.traces.append(trace)
        del self.traces[:-self.keep_traces]
        self.on_iteration_end(trace)

    def _tail(self, function: Any) -> None:
        setattr(function, TAG, (self._serial, TAIL))
        self.trace.tail_ops += 1

    def _sources(self, in_data: tuple) -> list[int | None]:
        """The tensor an op of this iteration made that each input array is (TAIL for a tail
        op's output), None for anything else: parameters, network inputs (maybe the same)."""
        out: list[int | None] = []
        for array in in_data:
            entry = None if array is None else self._arrays.get(id(array))
            out.append(entry[1] if entry is not None and entry[0]() is array else None)
        return out

    def register_array(self, array: Any, tid: int) -> None:
        """Remember that ``array`` holds tensor ``tid`` (so an op reading it is recognised)."""
        if array is None:
            return
        try:
            ref = weakref.ref(array)
        except TypeError:
            return
        self._arrays[id(array)] = (ref, tid)

    def _tensor_id(self, node: Any, producer: int, output_index: int) -> int:
        """The id of ``node`` in this iteration, recording it as a new tensor when first seen."""
        tag = getattr(node, TAG, None)
        if tag is not None and tag[0] is self._serial:
            return tag[1]
        tid = len(self.trace.tensors)
        self.trace.tensors.append(TensorRecord(tid, tuple(int(s) for s in node.shape),
                                               str(node.dtype), producer, output_index))
        setattr(node, TAG, (self._serial, tid))
        self.nodes[tid] = weakref.ref(node)
        return tid

    def _param_index(self, param: chainer.Parameter) -> int:
        """``param``'s place in ``trace.params``, recorded as an op of this iteration first reads it."""
        known = self._params.get(id(param))
        if known is not None and known[1]() is param:
            return known[0]
        index = len(self.trace.params)
        nbytes, graded = int(getattr(param.array, "nbytes", 0)), param.grad_var is not None
        self.trace.params.append(ParamRecord(nbytes, graded, cleared_before_forward=not graded
                                             and self.iteration == 0 and id(param) in self._graded))
        self._params[id(param)] = (index, weakref.ref(param))
        return index

    def gradients_held(self) -> set[int]:
        """``trace.params`` indices of the parameters that hold a gradient now."""
        return {index for index, ref in self._params.values()
                if getattr(ref(), "grad_var", None) is not None}

    def _resolve(self) -> None:
        """Finish recording the pending op now that Chainer has wired its inputs and outputs."""
        if self._pending is None:
            return
        index, function = self._pending
        self._pending = None
        if index == TAIL:
            for ref in function.outputs:
                node = ref()
                variable = None if node is None else node.get_variable_or_none()
                if variable is not None:
                    self.register_array(variable_array(variable), TAIL)
            return
        inputs, params, positions, differentiable, param_ids = [], [], {}, [], []
        if function.inputs is None:     # unchain_backward() cut it before it was resolved
            self._unsupported("unchain_backward() inside the forward cut an op from the graph "
                              "before PoocH saw its inputs; h.unchain() cuts there as well")
        for position, node in enumerate(function.inputs or ()):
            variable = node.get_variable_or_none()
            if isinstance(variable, chainer.Parameter):
                params.append((tuple(node.shape), str(node.dtype)))
                param_ids.append(self._param_index(variable))
                continue
            known = getattr(node, TAG, None)
            if known is None or known[0] is not self._serial:
                tid = self._tensor_id(node, -1, self._n_inputs)
                self._n_inputs += 1
            else:
                tid = known[1]
            positions[position] = len(inputs)
            if node.requires_grad:
                differentiable.append(len(inputs))
            inputs.append(tid)
        outputs = []
        for output_index, ref in enumerate(function.outputs or ()):
            node = ref()
            if node is None:   # an output nobody kept: record its slot, nothing refers to it
                tid = len(self.trace.tensors)
                self.trace.tensors.append(TensorRecord(tid, (), "", index, output_index))
            else:
                tid = self._tensor_id(node, index, output_index)
                variable = node.get_variable_or_none()
                if variable is not None:
                    self.register_array(variable_array(variable), tid)
                    self._holding.holder(variable, [self.trace.tensors[tid]])
            outputs.append(tid)
        retain_inputs, retain_outputs = retained_indexes(function) if outputs else ((), ())
        retained_in = [positions[i] for i in retain_inputs if i in positions]
        retained_out = list(retain_outputs)

        record = OpRecord(index, type(function).__name__, self._labels[index], inputs, outputs,
                          params, retained_in, retained_out, differentiable,
                          scalar_attrs(function) if self.record_attrs else {}, param_ids,
                          self._alone[index])
        self.trace.ops.append(record)
        if retained_in or retained_out:       # for a backward this pass may never run
            self._holding.node(function, record)
        self.on_forward_resolved(index, function)
