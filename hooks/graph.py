"""GraphRecorder: what Chainer really runs in one training iteration, as plain data.

A FunctionHook (plus a LinkHook for names) that records, per iteration, every forward
function in execution order (its activation inputs and outputs, parameter shapes, which
inputs / outputs it retains for backward, scalar attributes such as stride and pad) and the
order in which backward visits them. The analytic tracer turns that into a Profile with the
cost model; the profiler and the executor subclass it to time ops and to act at op
boundaries, so all three agree on op indices and tensor ids.

Facts of Chainer 7 this relies on (DESIGN.md):
* ``forward_postprocess`` runs before the outputs are wrapped and before retention is
  recorded, so an op is *resolved* (outputs, retained indexes) at the next hook call;
* functions applied inside a backward (e.g. Convolution2DGradW) belong to that backward op
  and are not forward ops;
* nothing is recorded while ``enable_backprop`` is off (evaluation, recomputation).

Tensor ids are assigned in creation order (network inputs when first consumed), which is what
``ProfileBuilder`` does, so ``GraphTrace.to_builder`` reproduces them exactly.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer

from pooch_ext.builder import ProfileBuilder
from pooch_ext.links import Link
from pooch_ext.profile import Device

_TAG = "_pooch_tag"   # attribute set on VariableNodes / FunctionNodes: (recording serial, index)


@dataclass
class TensorRecord:
    """One tensor of the iteration: a network input or a forward op's output."""

    tid: int
    shape: tuple[int, ...]
    dtype: str
    producer: int          # forward op index, -1 for a network input
    output_index: int


@dataclass
class OpRecord:
    """One forward function as Chainer ran it, with what it keeps for its backward."""

    index: int
    name: str              # type(function).__name__
    label: str             # path of the innermost link that called it, "" if none
    inputs: list[int]      # activation tensor ids, in argument order (parameters excluded)
    outputs: list[int]
    params: list[tuple[tuple[int, ...], str]]  # (shape, dtype) of parameter inputs
    retain_inputs: list[int]   # positions in ``inputs`` retained for backward
    retain_outputs: list[int]  # positions in ``outputs`` retained for backward
    differentiable: list[int]  # positions in ``inputs`` that require grad
    attrs: dict[str, Any]      # scalar attributes of the function node (stride, pad, ...)


@dataclass
class GraphTrace:
    """One iteration's graph: tensors by id, forward ops in order, backward visiting order."""

    tensors: list[TensorRecord] = field(default_factory=list)
    ops: list[OpRecord] = field(default_factory=list)
    backward_order: list[int] = field(default_factory=list)

    def signature(self) -> tuple:
        """What must match for a plan to apply: op names with their tensor ids, tensor
        shapes/dtypes and the backward order."""
        return (tuple((op.name, tuple(op.inputs), tuple(op.outputs)) for op in self.ops),
                tuple((t.shape, t.dtype) for t in self.tensors), tuple(self.backward_order))

    @property
    def loss(self) -> int:
        """The tensor backward starts from: first output of the op whose backward runs first."""
        if not self.backward_order:
            raise ValueError("no backward pass was recorded")
        return self.ops[self.backward_order[0]].outputs[0]

    def to_builder(self, device: Device, link: Link, cost: Callable[["GraphTrace", OpRecord], dict],
                   meta: dict | None = None, batch_scale: Callable | None = None) -> ProfileBuilder:
        """A ProfileBuilder holding this graph; ``cost(trace, op)`` gives the builder's keyword
        costs (duration_s, backward_s, transient_bytes, backward_transient_bytes, saved_bytes).
        ``batch_scale(shape) -> shape`` rewrites tensor shapes (e.g. to a larger batch)."""
        scale = batch_scale or (lambda shape: shape)
        builder = ProfileBuilder(device, link, dict(meta or {}))
        declared: set[int] = set()
        for op in self.ops:
            for tid in op.inputs:
                record = self.tensors[tid]
                if record.producer < 0 and tid not in declared:
                    assert builder.input(scale(record.shape), record.dtype) == tid
                    declared.add(tid)
            ids = builder.forward(
                op.name, op.inputs, [(scale(self.tensors[t].shape), self.tensors[t].dtype)
                                     for t in op.outputs],
                retain_inputs=op.retain_inputs, retain_outputs=op.retain_outputs,
                differentiable=op.differentiable, label=op.label, **cost(self, op))
            assert ids == op.outputs, "tensor ids must follow creation order"
        return builder


def _scalar_attrs(function: Any) -> dict[str, Any]:
    def plain(value: Any) -> bool:
        if isinstance(value, (bool, int, float, str)) or value is None:
            return True
        return isinstance(value, tuple) and all(isinstance(v, (bool, int, float)) for v in value)

    return {k: v for k, v in vars(function).items()
            if not k.startswith("_") and k not in ("rank", "inputs", "outputs", "stack", "lazy_grad_sum")
            and plain(v)}


class _LinkNames(chainer.LinkHook):
    """Keeps the stack of link paths being called, for op labels."""

    name = "PoochLinkNames"

    def __init__(self, model: chainer.Link | None) -> None:
        self.paths = {id(link): path.lstrip("/") for path, link in model.namedlinks()} if model else {}
        self.stack: list[str] = []

    def forward_preprocess(self, args: Any) -> None:
        self.stack.append(self.paths.get(id(args.link), type(args.link).__name__))

    def forward_postprocess(self, args: Any) -> None:
        if self.stack:
            self.stack.pop()


class GraphRecorder(chainer.FunctionHook):
    """Record each training iteration's graph; subclasses act at op boundaries.

    Use as a context manager around training (``with GraphRecorder(model) as rec: ...``).
    ``rec.traces`` holds one GraphTrace per completed iteration (``keep_traces`` of them).
    Subclass hooks (all no-ops here): ``on_iteration_start``, ``on_forward_begin(k, fn)``,
    ``on_forward_resolved(k, fn)``, ``on_backward_begin(j, k, fn)``,
    ``on_backward_end(j, k, fn)``, ``on_backward_complete(trace)`` (the backward pass has run
    every op it will run: the moment before the optimizer update), ``on_iteration_end(trace)``.
    """

    name = "PoochGraphRecorder"
    record_attrs = True    # subclasses that never read OpRecord.attrs may skip collecting them

    def __init__(self, model: chainer.Link | None = None, keep_traces: int = 8) -> None:
        self.model = model
        self.keep_traces = keep_traces
        self.traces: list[GraphTrace] = []
        self.trace: GraphTrace | None = None
        self.iteration = -1
        self.functions: list[weakref.ref] = []      # op index -> FunctionNode (this iteration)
        self.nodes: dict[int, weakref.ref] = {}     # tensor id -> VariableNode (this iteration)
        self.paused = False
        self._link_names = _LinkNames(model)
        self._pending: tuple[int, Any] | None = None
        self._labels: list[str] = []
        self._in_backward = 0
        self._serial = object()
        self._n_inputs = 0     # network inputs seen this iteration
        self._expected_backward = -1   # backward ops this iteration will run, once known

    # ------------------------------------------------------------ context
    def __enter__(self) -> "GraphRecorder":
        super().__enter__()
        self._link_names.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.finish()
        finally:
            self._link_names.__exit__(*exc)
            super().__exit__(*exc)

    def finish(self) -> None:
        """Close the current iteration (called at exit; also usable after a manual loop)."""
        self._resolve()
        if self.trace is not None and self.trace.ops:
            self._end_iteration()

    # ------------------------------------------------------------ subclass hooks
    def on_iteration_start(self) -> None: ...
    def on_forward_begin(self, index: int, function: Any) -> None: ...
    def on_forward_resolved(self, index: int, function: Any) -> None: ...
    def on_backward_begin(self, index: int, fwd_index: int, function: Any) -> None: ...
    def on_backward_end(self, index: int, fwd_index: int, function: Any) -> None: ...
    def on_backward_complete(self, trace: GraphTrace) -> None: ...
    def on_iteration_end(self, trace: GraphTrace) -> None: ...

    # ------------------------------------------------------------ chainer hooks
    def _recording(self) -> bool:
        return not self.paused and self._in_backward == 0 and chainer.config.enable_backprop

    def forward_preprocess(self, function: Any, in_data: tuple) -> None:
        if not self._recording():
            return
        self._resolve()
        if self.trace is None or self.trace.backward_order:
            if self.trace is not None:
                self._end_iteration()
            self._start_iteration()
        index = len(self.functions)
        setattr(function, _TAG, (self._serial, index))
        self.functions.append(weakref.ref(function))
        self._labels.append(self._link_names.stack[-1] if self._link_names.stack else "")
        self.on_forward_begin(index, function)

    def forward_postprocess(self, function: Any, in_data: tuple) -> None:
        if not self._recording() or getattr(function, _TAG, (None,))[0] is not self._serial:
            return
        self._pending = (getattr(function, _TAG)[1], function)

    def backward_preprocess(self, function: Any, in_data: tuple, out_grad: tuple) -> None:
        if self.paused:
            return
        self._resolve()
        tag = getattr(function, _TAG, None)
        if tag is None or tag[0] is not self._serial or self.trace is None:
            return
        self._in_backward += 1
        if not self.trace.backward_order:
            self._expected_backward = self._count_backward_ops(function)
        self.trace.backward_order.append(tag[1])
        self.on_backward_begin(self._backward_index(), tag[1], function)

    def backward_postprocess(self, function: Any, in_data: tuple, out_grad: tuple) -> None:
        tag = getattr(function, _TAG, None)
        if self.paused or tag is None or tag[0] is not self._serial or self._in_backward == 0:
            return
        self._in_backward -= 1
        self.on_backward_end(self._backward_index(), tag[1], function)
        if len(self.trace.backward_order) == self._expected_backward:
            self.on_backward_complete(self.trace)

    def _count_backward_ops(self, loss_creator: Any) -> int:
        """How many recorded functions Chainer's backward will visit from ``loss_creator``: it
        follows inputs that require grad and runs a function if any input requires grad
        (chainer._backprop._backprop_to_all). A function returning no gradient for an input
        that requires one would make Chainer visit fewer; then on_backward_complete is not
        called and the iteration simply ends at the next forward op."""
        seen, frontier, count = {id(loss_creator)}, [loss_creator], 0
        while frontier:
            function = frontier.pop()
            tag = getattr(function, _TAG, None)
            grad_inputs = [node for node in function.inputs if node.requires_grad]
            if tag is not None and tag[0] is self._serial and grad_inputs:
                count += 1
            for node in grad_inputs:
                creator = node.creator_node
                if creator is not None and id(creator) not in seen:
                    seen.add(id(creator))
                    frontier.append(creator)
        return count

    # ------------------------------------------------------------ bookkeeping
    def _backward_index(self) -> int:
        return len(self.trace.ops) + len(self.trace.backward_order) - 1

    def _start_iteration(self) -> None:
        self.iteration += 1
        self.trace = GraphTrace()
        self.functions = []
        self._labels = []
        self.nodes = {}
        self._serial = object()
        self._n_inputs = 0
        self._expected_backward = -1
        self.on_iteration_start()

    def _end_iteration(self) -> None:
        trace = self.trace
        self.traces.append(trace)
        del self.traces[:-self.keep_traces]
        self.on_iteration_end(trace)

    def _tensor_id(self, node: Any, producer: int, output_index: int) -> int:
        """The id of ``node`` in this iteration, recording it as a new tensor when first seen."""
        tag = getattr(node, _TAG, None)
        if tag is not None and tag[0] is self._serial:
            return tag[1]
        tid = len(self.trace.tensors)
        self.trace.tensors.append(TensorRecord(tid, tuple(int(s) for s in node.shape),
                                               str(node.dtype), producer, output_index))
        setattr(node, _TAG, (self._serial, tid))
        self.nodes[tid] = weakref.ref(node)
        return tid

    def _resolve(self) -> None:
        """Finish recording the pending op now that Chainer has wired its inputs and outputs."""
        if self._pending is None:
            return
        index, function = self._pending
        self._pending = None
        inputs, params, positions, differentiable = [], [], {}, []
        for position, node in enumerate(function.inputs):
            variable = node.get_variable_or_none()
            if isinstance(variable, chainer.Parameter):
                params.append((tuple(node.shape), str(node.dtype)))
                continue
            known = getattr(node, _TAG, None)
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
        for output_index, ref in enumerate(function.outputs):
            node = ref()
            if node is None:   # an output nobody kept: record its slot, nothing refers to it
                tid = len(self.trace.tensors)
                self.trace.tensors.append(TensorRecord(tid, (), "", index, output_index))
            else:
                tid = self._tensor_id(node, index, output_index)
            outputs.append(tid)
        retained_in = [positions[i] for i in (function._input_indexes_to_retain or ())
                       if i in positions]
        retained_out = list(function._output_indexes_to_retain or ())
        self.trace.ops.append(OpRecord(index, type(function).__name__, self._labels[index], inputs, outputs,
                                       params, retained_in, retained_out, differentiable,
                                       _scalar_attrs(function) if self.record_attrs else {}))
        self.on_forward_resolved(index, function)
