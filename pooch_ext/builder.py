"""ProfileBuilder: turn a forward graph plus per-op costs into a Profile.

One place decides what memory an iteration allocates and when (the in-core order of the
Profile contract), so the analytic tracer, hand-built test profiles and synthetic random
networks all follow the same rules:

* network inputs are allocated before op 0 and held by the caller to the end;
* a forward op allocates its outputs and transient scratch (freed at once) and any internal
  state it saves for backward (``saved_bytes``: pooling argmax, BN statistics, dropout mask),
  held until its backward op; a tensor no backward op needs is freed after its last forward
  consumer (outputs nobody consumes are held by the caller to the end);
* a backward op allocates the gradients of its differentiable activation inputs (once per
  tensor, at the first backward op that produces it), its transient scratch (freed at once),
  frees the gradients of its forward op's outputs, then frees every feature map whose last
  backward use it is;
* parameters, their gradients and optimizer state are ``resident_bytes``, except the gradients
  a loop clears before backward (``parameter_gradient``, measured): such a gradient is held
  from op 0 if forward still had the last iteration's, freed as forward ends, made again by
  the first backward op of an op that reads the parameter and held to the end;
* a tensor something outside PoocH's control holds past its last use (``hold``: measured
  from the caller's Variables and the function nodes of a real run) is freed only after
  that op; a feature map so held into backward cannot be moved at all (kind "held").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from pooch_ext.links import Link
from pooch_ext.profile import Device, Profile
from pooch_ext.functions import recompute_refusal


def nbytes_of(shape: Sequence[int], dtype: str = "float32") -> int:
    """Device bytes of an array of ``shape`` and ``dtype``."""
    if not dtype:   # an output nobody kept (GraphRecorder saw no array): it holds no memory
        return 0
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


@dataclass
class _Op:
    name: str
    inputs: list[int]
    outputs: list[int]
    retained: list[int]            # activation tensors the backward needs
    differentiable: list[int]      # activation inputs that receive a gradient
    duration_s: float
    backward_s: float
    transient_bytes: int
    backward_transient_bytes: int
    saved_bytes: int
    label: str
    rerun_s: float                 # seconds to run it again in a recomputation
    configs: list                  # split configurations (pieces, transient, seconds)
    backward_configs: list         # the same for its backward op


@dataclass
class _Tensor:
    shape: tuple[int, ...]
    dtype: str
    producer: int                  # forward op position, -1 for inputs
    output_index: int
    is_input: bool
    gradient_bytes: int = -1       # measured bytes its gradient holds (-1: as dense as it)


@dataclass
class ProfileBuilder:
    """Collect forward ops in execution order, then ``build()`` the full iteration."""

    device: Device
    link: Link
    meta: dict = field(default_factory=dict)
    _tensors: list[_Tensor] = field(default_factory=list)
    _ops: list[_Op] = field(default_factory=list)
    _resident: int = 0
    _held: dict[int, int] = field(default_factory=dict)
    _param_grads: list[tuple[int, tuple[int, ...], bool]] = field(default_factory=list)

    def input(self, shape: Sequence[int], dtype: str = "float32") -> int:
        """A network input (held by the caller, never classified); returns its tensor id."""
        n_inputs = sum(t.is_input for t in self._tensors)
        self._tensors.append(_Tensor(tuple(int(s) for s in shape), str(dtype), -1, n_inputs, True))
        return len(self._tensors) - 1

    def forward(self, name: str, inputs: Sequence[int], outputs: Sequence[tuple],
                duration_s: float, backward_s: float = 0.0, *,
                retain_inputs: Sequence[int] = (), retain_outputs: Sequence[int] = (),
                differentiable: Sequence[int] | None = None, transient_bytes: int = 0,
                backward_transient_bytes: int = 0, saved_bytes: int = 0,
                label: str = "", rerun_s: float | None = None,
                configs: Sequence[tuple] = (), backward_configs: Sequence[tuple] = (),
                output_gradient_bytes: Sequence[int] = ()) -> list[int]:
        """Record a forward op; returns the ids of its outputs.

        ``inputs`` are activation tensor ids (parameters are not tensors here), ``outputs``
        (shape, dtype) pairs; ``retain_inputs`` / ``retain_outputs`` are positions of what
        the op's backward needs; ``differentiable`` are positions of inputs that get a
        gradient (default: every input that is not a network input); ``rerun_s`` the time
        to run it again in a recomputation (default: ``duration_s``); ``configs`` /
        ``backward_configs`` the op's split configurations (profile.py, ops ``configs``);
        ``output_gradient_bytes`` per output, the bytes its gradient was measured to hold
        where less than its own (a broadcast view: F.sum's backward), -1 unmeasured.
        """
        for t in inputs:
            if not 0 <= t < len(self._tensors):
                raise ValueError(f"{name}: unknown input tensor {t}")
        position = len(self._ops)
        ids = []
        measured = list(output_gradient_bytes) + [-1] * (len(outputs) - len(output_gradient_bytes))
        for index, (shape, dtype) in enumerate(outputs):
            self._tensors.append(_Tensor(tuple(int(s) for s in shape), str(dtype), position,
                                         index, False, int(measured[index])))
            ids.append(len(self._tensors) - 1)
        if differentiable is None:
            differentiable = [i for i, t in enumerate(inputs) if not self._tensors[t].is_input]
        retained = [inputs[i] for i in retain_inputs] + [ids[i] for i in retain_outputs]
        self._ops.append(_Op(name, list(inputs), ids, list(dict.fromkeys(retained)),
                             [inputs[i] for i in differentiable], float(duration_s),
                             float(backward_s), int(transient_bytes),
                             int(backward_transient_bytes), int(saved_bytes), label,
                             float(duration_s if rerun_s is None else rerun_s),
                             list(configs), list(backward_configs)))
        return ids

    def hold(self, tensor: int, until_op: int) -> None:
        """Something outside PoocH holds ``tensor`` until op ``until_op`` (an op index of the
        built profile: forward op k, or n_forward + j for backward op j; anything past the
        last op means to the end)."""
        if not 0 <= tensor < len(self._tensors):
            raise ValueError(f"hold: unknown tensor {tensor}")
        self._held[tensor] = max(int(until_op), self._held.get(tensor, -1))

    def resident(self, nbytes: int) -> None:
        """Add bytes no policy moves (parameters, gradients, optimizer state)."""
        self._resident += int(nbytes)

    def parameter_gradient(self, nbytes: int, readers: Sequence[int], in_forward: bool) -> None:
        """A parameter gradient of ``nbytes`` that the loop clears before backward (so it is not
        resident): made by the first backward op of the forward ops ``readers``; ``in_forward``:
        the last iteration's is still held during forward."""
        if any(not 0 <= k < len(self._ops) for k in readers):
            raise ValueError(f"parameter_gradient: readers {list(readers)} are not forward ops")
        self._param_grads.append((int(nbytes), tuple(int(k) for k in readers), bool(in_forward)))

    # ------------------------------------------------------------------ build
    def build(self, loss: int | None = None, backward_order: Sequence[int] | None = None,
              update_s: float = 0.0) -> Profile:
        """Assemble the Profile.

        ``loss``: the tensor backward starts from (default: first output of the last op).
        ``backward_order``: forward op positions in the order their backward runs (the real
        order Chainer used, from a trace); default: reverse execution order of the ops the
        loss depends on.
        """
        if not self._ops:
            raise ValueError("a profile needs at least one forward op")
        n_fwd = len(self._ops)
        loss = self._ops[-1].outputs[0] if loss is None else loss
        order = list(backward_order) if backward_order is not None else self._default_order(loss)
        if len(set(order)) != len(order) or not all(0 <= f < n_fwd for f in order):
            raise ValueError("backward_order must list distinct forward op positions")
        bwd_index = {f: n_fwd + j for j, f in enumerate(order)}   # forward op -> backward op
        n_ops = n_fwd + len(order) + (1 if update_s > 0 else 0)
        last_op = n_ops - 1

        fwd_consumers: dict[int, list[int]] = {t: [] for t in range(len(self._tensors))}
        bwd_consumers: dict[int, list[int]] = {t: [] for t in range(len(self._tensors))}
        for k, op in enumerate(self._ops):
            for t in dict.fromkeys(op.inputs):
                fwd_consumers[t].append(k)
            if k in bwd_index:
                for t in op.retained:
                    bwd_consumers[t].append(bwd_index[k])
        kinds = ["input" if t.is_input else "feature_map" if bwd_consumers[i] else "intermediate"
                 for i, t in enumerate(self._tensors)]
        held = {t: min(h, last_op) for t, h in self._held.items()}
        for t, h in held.items():
            if kinds[t] == "feature_map" and h >= n_fwd:
                kinds[t] = "held"

        ops_rows = []
        for k, op in enumerate(self._ops):
            ops_rows.append(dict(op=k, phase="forward", name=op.name, label=op.label, fwd_op=-1,
                                 duration_s=op.duration_s, inputs=op.inputs, outputs=op.outputs,
                                 needs=list(dict.fromkeys(op.inputs)),
                                 transient_bytes=op.transient_bytes, rerun_s=op.rerun_s,
                                 configs=op.configs))
        for f in order:
            op = self._ops[f]
            ops_rows.append(dict(op=bwd_index[f], phase="backward", name=op.name, label=op.label,
                                 fwd_op=f, duration_s=op.backward_s, inputs=[], outputs=[],
                                 needs=op.retained, transient_bytes=op.backward_transient_bytes,
                                 configs=op.backward_configs))
        if update_s > 0:
            ops_rows.append(dict(op=last_op, phase="update", name="update", label="", fwd_op=-1,
                                 duration_s=float(update_s), inputs=[], outputs=[], needs=[],
                                 transient_bytes=0))

        memory = self._memory_events(loss, order, bwd_index, kinds, fwd_consumers, bwd_consumers,
                                     last_op, held)
        tensors_rows = self._tensor_rows(kinds, fwd_consumers, bwd_consumers, held, last_op)
        return Profile(ops_rows, tensors_rows, memory, self._resident, self.device, self.link,
                       dict(self.meta))

    def _default_order(self, loss: int) -> list[int]:
        needed, frontier = set(), [loss]
        while frontier:
            producer = self._tensors[frontier.pop()].producer
            if producer >= 0 and producer not in needed:
                needed.add(producer)
                frontier.extend(self._ops[producer].inputs)
        return sorted(needed, reverse=True)

    def _bytes(self, t: int) -> int:
        return nbytes_of(self._tensors[t].shape, self._tensors[t].dtype)

    def _gradient_bytes(self, t: int) -> int:
        """What tensor t's gradient holds: its own bytes, or fewer where measured so."""
        measured = self._tensors[t].gradient_bytes
        return self._bytes(t) if measured < 0 else min(measured, self._bytes(t))

    def _memory_events(self, loss, order, bwd_index, kinds, fwd_consumers, bwd_consumers, last_op,
                       held):
        # Long on purpose: one pass in op order that places every allocation and free of an
        # in-core iteration (forward outputs, held maps, backward gradients, temporaries,
        # parameter gradients, the update); split, the order of events would be spread over
        # several functions that must agree on it.
        events: list[tuple] = []   # (op, kind, bytes, tensor, category)
        free_after: dict[int, int] = {}   # intermediates and held maps: op of their free
        for t, kind in enumerate(kinds):
            if kind == "intermediate" and (fwd_consumers[t] or t in held):
                free_after[t] = max(fwd_consumers[t][-1] if fwd_consumers[t] else -1,
                                    held.get(t, -1), self._tensors[t].producer)
            elif kind == "held":
                free_after[t] = max(held[t], max(bwd_consumers[t]))

        def add(op, kind, nbytes, tensor=-1, category="activation"):
            if nbytes > 0:
                events.append((op, kind, nbytes, tensor, category))

        held_to_end = []
        for nbytes, _, in_forward in self._param_grads:
            if in_forward:
                add(0, "malloc", nbytes, category="gradient")
        for t, tensor in enumerate(self._tensors):
            if tensor.is_input:
                add(0, "malloc", self._bytes(t), t)
                held_to_end.append(t)
        for k, op in enumerate(self._ops):
            for t in op.outputs:
                add(k, "malloc", self._bytes(t), t)
            add(k, "malloc", op.transient_bytes, category="transient")
            add(k, "free", op.transient_bytes, category="transient")
            if k in bwd_index:
                add(k, "malloc", op.saved_bytes, category="other")
            for t in op.outputs:
                if kinds[t] == "intermediate" and t not in free_after:
                    held_to_end.append(t)     # nobody reads it: the caller holds it
        if order:   # the loop clears the parameter gradients as forward ends
            for nbytes, _, in_forward in self._param_grads:
                if in_forward:
                    add(len(self._ops) - 1, "free", nbytes, category="gradient")
        grad_allocated: set[int] = set()
        remade: dict[int, list[int]] = {}   # backward op -> the parameter gradients it makes
        for nbytes, readers, _ in self._param_grads:
            made = [bwd_index[k] for k in readers if k in bwd_index]
            if made:
                remade.setdefault(min(made), []).append(nbytes)
        if order:   # the loss gradient seeds backward
            grad_allocated.add(loss)
            add(bwd_index[order[0]], "malloc", self._gradient_bytes(loss), category="gradient")
        for f in order:
            j, op = bwd_index[f], self._ops[f]
            for t in dict.fromkeys(op.differentiable):
                if t not in grad_allocated:
                    grad_allocated.add(t)
                    add(j, "malloc", self._gradient_bytes(t), category="gradient")
            for nbytes in remade.get(j, ()):
                add(j, "malloc", nbytes, category="gradient")
            add(j, "malloc", op.backward_transient_bytes, category="transient")
            add(j, "free", op.backward_transient_bytes, category="transient")
            for t in op.outputs:
                if t in grad_allocated:
                    add(j, "free", self._gradient_bytes(t), category="gradient")
            add(j, "free", op.saved_bytes, category="other")
            for t in op.retained:
                if kinds[t] == "feature_map" and max(bwd_consumers[t]) == j:
                    add(j, "free", self._bytes(t), t)
        for t, op in free_after.items():
            add(op, "free", self._bytes(t), t)
        for t in held_to_end:
            add(last_op, "free", self._bytes(t), t)
        # gradients of network inputs that were never consumed by a producer's backward
        leftover = [t for t in grad_allocated if self._tensors[t].producer < 0
                    or self._tensors[t].producer not in bwd_index]
        for t in leftover:
            add(last_op, "free", self._gradient_bytes(t), category="gradient")
        held_to_the_end = [nbytes for made in remade.values() for nbytes in made]
        if not order:   # no backward: a gradient forward held was never cleared
            held_to_the_end += [nbytes for nbytes, _, in_forward in self._param_grads if in_forward]
        for nbytes in held_to_the_end:
            add(last_op, "free", nbytes, category="gradient")
        return [dict(seq=i, op=op, kind=kind, bytes=b, tensor=t, category=c)
                for i, (op, kind, b, t, c) in enumerate(sorted(events, key=lambda e: e[0]))]

    def _tensor_rows(self, kinds, fwd_consumers, bwd_consumers, held, last_op):
        rows = []
        for t, tensor in enumerate(self._tensors):
            nbytes = self._bytes(t)
            chain, sources = (self._recompute_chain(t, kinds, held, last_op)
                              if kinds[t] == "feature_map" else ([], []))
            why_not = []
            if kinds[t] == "input":
                can = (True, False, False)
                why_not.append("network input: the caller holds it")
            elif kinds[t] == "intermediate":
                can = (True, False, False)
                why_not.append("intermediate: no backward op needs it")
            elif kinds[t] == "held":
                can = (True, False, False)
                why_not.append(f"held beyond its last use until op {held[t]} (by the caller's "
                               "code or a later backward pass): moving it frees nothing")
            else:
                refusals = [recompute_refusal(self._ops[k].name) for k in chain]
                refusals = [r for r in refusals if r]
                can = (True, True, not refusals)
                why_not.extend(dict.fromkeys(refusals))
            rows.append(dict(
                tensor=t, producer=tensor.producer, output_index=tensor.output_index,
                shape=tensor.shape, dtype=tensor.dtype, bytes=nbytes, kind=kinds[t],
                fwd_consumers=fwd_consumers[t], bwd_consumers=bwd_consumers[t],
                swap_out_s=self.link.swap_out_s(nbytes), swap_in_s=self.link.swap_in_s(nbytes),
                recompute_ops=chain, recompute_sources=sources,
                recompute_s=sum(self._ops[k].rerun_s for k in chain),
                can_keep=can[0], can_swap=can[1], can_recompute=can[2],
                why_not="; ".join(why_not), held_until=held.get(t, -1)))
        return rows

    def _recompute_chain(self, t: int, kinds, held, last_op) -> tuple[list[int], list[int]]:
        """Forward ops that rebuild ``t`` from the nearest tensors that outlive forward (a held
        map is a source only when it is held to the end)."""
        chain: set[int] = set()
        sources: list[int] = []
        frontier = [t]
        while frontier:
            current = frontier.pop()
            producer = self._tensors[current].producer
            if producer in chain:
                continue
            chain.add(producer)
            for source in self._ops[producer].inputs:
                if kinds[source] == "intermediate" or (kinds[source] == "held"
                                                       and held[source] < last_op):
                    frontier.append(source)
                elif source not in sources:
                    sources.append(source)
        return sorted(chain), sorted(sources)
