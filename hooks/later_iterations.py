"""What an iteration after the first holds that the first did not, for a profile made of the
first iteration's measurements alone (the one PoocH checks the budget on before any update):
the last graph a loop keeps through the next forward, the gradients it clears only after
that forward, and the tail of the last iteration (later backward passes, the update, the
loop's own code) before the next one's first op. ``sample`` is a
hooks/measured_profile.IterationSample."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from pooch_ext.profile import Profile


def carried_bytes(profile: Profile, sample: Any, predicted: pd.DataFrame,
                  cleared: int) -> np.ndarray:
    """Per op, the bytes an iteration after ``sample`` may hold that it did not: the first
    iteration has no earlier graph, but a loop that keeps its loss Variable (``loss =
    ...; loss.backward()``, L.Classifier's ``self.loss``) holds the last graph until the
    next forward ends (what its nodes kept for a backward that ran goes as the iteration
    ends: Executor._drop_node_state), and a loop that clears gradients after its forward
    holds the last ones. That is what the device held as the first backward pass completed
    (or, after more passes, as the update began) above the model's level there (before the
    iteration end's own actions), at most those gradients (``cleared`` bytes) and what
    nodes whose backward did not run keep (what else is held is for a later pass, or goes
    as the iteration ends: after more passes it had all been charged, and a user's loop
    with two losses, each its own backward, was refused at 1.21 times its in-core need),
    charged to every forward op; the gradients of the network inputs that require one
    (``input_gradient_bytes``) also to every backward op. An upper bound: a loop that drops
    the graph, or clears gradients before its forward, carries nothing."""
    carried = np.zeros(len(predicted), np.int64)
    if sample.first and sample.end is not None and sample.end[0] < len(predicted):
        boundary, held, _ = sample.end      # after one pass or more, the same rule
        # at the iteration's last boundary, its own actions came after the measurement
        level = int(predicted["bytes_before" if boundary == len(predicted) - 1
                              else "bytes"].iloc[boundary])
        ran = sample.trace.backward_ran
        graded = input_gradient_bytes(sample.trace)
        own = sum(nbytes for k, nbytes in sample.saved_bytes.items() if k not in ran) \
            + cleared + graded
        n_fwd = len(profile.forward_ops)
        carried[:n_fwd] = max(0, min(held - level, own)) + caller_held_bytes(sample.trace)
        carried[n_fwd:] += graded     # made as the first backward ended: held through it later
    carried += stale_accumulation(profile, sample, len(carried))
    return carried


def caller_held_bytes(trace: Any) -> int:
    """Bytes of the maps a Variable still held as the check came (``caller_held``): a loop
    that keeps them (``y, features = model(x)`` at the top of the loop, for logging) holds
    the last iteration's through the next forward, until that forward returns and they are
    replaced (measured: three 128 KB activations took every later iteration of a user's MLP
    11.6% over a budget the first check accepted), with the gradients ``retain_grad=True``
    left on them (15%). An upper bound: what a step function's names hold goes as it
    returns."""
    return sum(_nbytes(t) * (1 + t.caller_grad) for t in trace.tensors
               if t.caller_held and t.producer >= 0)


def _nbytes(record: Any) -> int:
    return math.prod(record.shape) * np.dtype(record.dtype).itemsize


def input_gradient_bytes(trace: Any) -> int:
    """Bytes of the gradients backward gives the network inputs that require one (a Variable
    the loop made, such as a recurrent state made before the loop): Chainer stores each on
    its Variable, so a loop that keeps that Variable (the state's first value, referred to
    by name) holds it through every later iteration. The first iteration made it only as its
    backward ended (measured: a hand-written RNN's 8 KB initial state; its gradient took
    every later iteration 5 KB over a budget the first check accepted)."""
    inputs = {t.tid: t for t in trace.tensors if t.producer == -1}
    graded = {op.inputs[k] for op in trace.ops for k in op.differentiable
              if op.inputs[k] in inputs}
    return sum(_nbytes(inputs[t]) for t in graded)


def stale_accumulation(profile: Profile, sample: Any, n_ops: int) -> np.ndarray:
    """Per op, what summing a gradient onto the last iteration's costs where ``sample`` had
    none: a parameter whose gradient the first pass wrote and the loop cleared only before
    a later pass (a GAN's generator, whose optimizer clears it before its own pass) comes
    to the first pass of a later iteration holding the last one; the op that makes its
    gradient then holds the new one and their sum beside it (twice its bytes; measured: a
    generator's 789 KB weight took a later iteration's peak up 1.45 MB)."""
    extra = np.zeros(n_ops, np.int64)
    trace = sample.trace
    if not trace.backward_order:
        return extra
    n_fwd = len(profile.forward_ops)
    position = {k: j for j, k in enumerate(trace.backward_order)}
    for p in sample.stale_gradients:
        record = trace.params[p] if p < len(trace.params) else None
        writers = [n_fwd + position[op.index] for op in trace.ops
                   if p in op.param_ids and op.index in position]
        if record is not None and not record.grad_in_backward and writers \
                and min(writers) < n_ops:
            extra[min(writers)] += 2 * record.nbytes
    return extra


def later_gaps(sample: Any, carried: np.ndarray) -> dict[int, int]:
    """``sample.gap_bytes`` as a later iteration would measure them: with what it carries
    (``carried_bytes``), and before the first op the first iteration's tail (``tail_peak``)
    and what ran before its first op (``head_peak``)."""
    gaps = {op: gap + int(carried[op]) for op, gap in sample.gap_bytes.items()
            if op < len(carried)}
    if sample.first and sample.tail_peak is not None:
        gaps[0] = max(gaps.get(0, 0), sample.tail_peak)
    if sample.first and sample.head_peak is not None and len(carried):
        # what ran before the first op (a distillation teacher's forward) runs again in a
        # later iteration beside what it carries and, before that first op lets it go, what
        # the last graph's nodes kept for their backward (measured: 266 KB of pooling argmax)
        ran = sample.trace.backward_ran
        kept = sum(nbytes for k, nbytes in sample.saved_bytes.items() if k in ran)
        gaps[0] = max(gaps.get(0, 0), sample.head_peak + int(carried[0]) + kept)
    elif sample.head_peak is not None and len(carried):   # ran with the last graph held
        gaps[0] = max(gaps.get(0, 0), sample.head_peak + int(carried[0]))
    return gaps
