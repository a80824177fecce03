"""GraphTrace: one training iteration's graph as Chainer ran it, as plain data (the contract
between the runtime's GraphRecorder, which records it, and the planning core: the analytic
tracer and rescaler read it, ``to_builder`` turns it into a Profile). No chainer here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from pooch_ext.builder import ProfileBuilder
from pooch_ext.inplace import ALONE
from pooch_ext.links import Link
from pooch_ext.profile import Device

HELD_TO_END = 1 << 30


@dataclass
class TensorRecord:
    """One tensor of the iteration: a network input or a forward op's output."""

    tid: int
    shape: tuple[int, ...]
    dtype: str
    producer: int          # forward op index, -1 for a network input
    output_index: int
    # last op (forward index, or n_forward + j for backward op j) during which something beyond
    # PoocH's control still held the array: the caller's Variable, a function node that keeps
    # it for a backward this pass never runs, a later backward pass; -1 when nothing did past
    # its last use, HELD_TO_END when something still did as the iteration ended
    held_until: int = -1
    # still held by a Variable (the caller's names, a link's attribute) as the iteration
    # ended: a loop that keeps it (``y, features = model(x)``) holds it into the next forward
    caller_held: bool = False
    caller_grad: bool = False   # ... with its gradient (``backward(retain_grad=True)``)


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
    param_ids: list[int] = field(default_factory=list)   # GraphTrace.params, as ``params``
    # nothing but its Variable referred to its one input array (pooch_ext/inplace.py)
    input_alone: bool = False


@dataclass
class ParamRecord:
    """A parameter the iteration's ops read, and whether its gradient existed when forward
    first read it and when backward began: a loop that clears gradients between the two
    (``optimizer.update(lossfun)``, ``cleargrads()`` before ``backward()``) holds them in
    forward but not at the start of backward, where each is made again by the first backward
    op that reads the parameter."""

    nbytes: int
    grad_in_forward: bool
    grad_in_backward: bool = False
    # the first iteration's forward found none where the parameter had one as PoocH began
    # (Chainer's NaN one, a trained model's): the loop clears gradients before its forward,
    # so a later forward holds none either
    cleared_before_forward: bool = False


@dataclass
class GraphTrace:
    """One iteration's graph: tensors by id, forward ops in order, backward visiting order."""

    tensors: list[TensorRecord] = field(default_factory=list)
    ops: list[OpRecord] = field(default_factory=list)
    backward_order: list[int] = field(default_factory=list)   # the first backward pass
    params: list[ParamRecord] = field(default_factory=list)   # in the order ops first read them
    passes: int = 0                 # backward passes that ran over this iteration's graph
    revisited: set[int] = field(default_factory=set)   # forward ops later passes ran again
    tail_ops: int = 0               # forward ops run after the first pass on this graph
    unsupported: str = ""           # why PoocH cannot run this iteration exactly, if so
    failed: bool = False            # its first backward pass raised (a loop may go on)

    def signature(self) -> tuple:
        """What must match for a plan to apply: op names with their tensor ids, tensor
        shapes/dtypes and the backward order."""
        return (tuple((op.name, tuple(op.inputs), tuple(op.outputs)) for op in self.ops),
                tuple((t.shape, t.dtype) for t in self.tensors), tuple(self.backward_order))

    @property
    def backward_ran(self) -> set[int]:
        """Forward ops whose backward ran, in the first pass or a later one."""
        return set(self.backward_order) | self.revisited

    @property
    def loss(self) -> int:
        """The tensor backward starts from: first output of the op whose backward runs first."""
        if not self.backward_order:
            raise ValueError("no backward pass was recorded")
        return self.ops[self.backward_order[0]].outputs[0]

    def drop_leading(self, n_ops: int, n_tensors: int) -> None:
        """Drop the first ``n_ops`` forward ops and ``n_tensors`` tensors (a leading forward
        pass that is no part of the iteration) and renumber the rest."""
        ops = self.ops[n_ops:]
        for op in ops:
            op.index -= n_ops
            op.inputs = [t - n_tensors for t in op.inputs]
            op.outputs = [t - n_tensors for t in op.outputs]
        tensors = self.tensors[n_tensors:]
        for record in tensors:
            record.tid -= n_tensors
            if record.producer >= 0:
                record.producer -= n_ops
            if record.held_until >= 0 and record.held_until != HELD_TO_END:
                record.held_until = max(0, record.held_until - n_ops)
        self.ops, self.tensors = ops, tensors

    def to_builder(self, device: Device, link: Link, cost: Callable[["GraphTrace", OpRecord], dict],
                   meta: dict | None = None, batch_scale: Callable | None = None) -> ProfileBuilder:
        """A ProfileBuilder holding this graph; ``cost(trace, op)`` gives the builder's keyword
        costs (duration_s, backward_s, transient_bytes, backward_transient_bytes, saved_bytes).
        ``batch_scale(shape) -> shape`` rewrites tensor shapes (e.g. to a larger batch)."""
        scale = batch_scale or (lambda shape: shape)
        builder = ProfileBuilder(device, link, {
            **(meta or {}), ALONE: [k for k, op in enumerate(self.ops) if op.input_alone]})
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
        for record in self.tensors:
            if record.held_until != -1:      # -2: still held when the trace was taken
                builder.hold(record.tid, HELD_TO_END if record.held_until == -2
                             else record.held_until)
        return builder
