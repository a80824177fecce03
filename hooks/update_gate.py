"""The update gate: the moments to refuse a training run without changing anything.

Until lifted, every optimizer first calls ``before_update``: at the first update, every
backward pass before it has run, Chainer's own errors included, and no parameter, step
count or optimizer state has changed yet (PoocH raises a refusal there, with the models as
they were). Both the optimizer's 'pre' hooks (run before its step count moves) and each
update rule (for optimizers without them) are gated. The caller lifts the gate (``lift``)
once no refusal can come (PoocH: as its first iteration with an update ends, so a later
update of that iteration, after another backward pass, may refuse too); while
``on_optimizer`` is set, each optimizer's 'pre' hooks hand it the optimizer first (PoocH
snapshots its step counts and state, to put them back on such a refusal).

Every update rule also runs inside ``around()`` while installed: on the CPU device its NumPy
temporaries are not device memory, because on a GPU Chainer's update rules (SGD, MomentumSGD,
Adam, AdaGrad, RMSprop, ...) are one elementwise kernel that writes the parameter and its
state in place. Measured on the CPU device without it (tests/promise_situations.py's
big_layer: 0.54 MB of parameters, Adam, a 3.3 MB budget): 3.72 MB held during every update,
which no op's check sees; with it, 2.21 MB at most.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, ContextManager

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer


class UpdateGate:
    """Calls ``before_update()`` ahead of every optimizer update until lifted, and runs every
    update rule inside ``around()``, while installed."""

    def __init__(self, before_update: Callable[[], None],
                 around: Callable[[], ContextManager] = nullcontext) -> None:
        self.before_update = before_update
        self.around = around
        self.lifted = False
        self.on_optimizer: Callable[[Any], None] | None = None   # each update's optimizer
        self.on_param: Callable[[Any], None] | None = None   # each parameter about to change
        self._originals: list[tuple[Any, str, Any]] = []

    def install(self) -> None:
        if self._originals:
            return
        rule_update = chainer.optimizer.UpdateRule.update
        call_hooks = chainer.optimizer.Optimizer.call_hooks
        gate = self

        def update(rule: Any, param: Any) -> Any:
            if not gate.lifted:
                gate.before_update()
            if gate.on_param is not None and rule.enabled and param.grad is not None:
                gate.on_param(param)          # a rule disabled or without a gradient skips it
            with gate.around():
                return rule_update(rule, param)

        def hooks(optimizer: Any, timing: str = "pre") -> Any:
            if timing == "pre" and gate.on_optimizer is not None:
                gate.on_optimizer(optimizer)        # before it changes anything
            if timing == "pre" and not gate.lifted:
                gate.before_update()
            return call_hooks(optimizer, timing)
        self._originals = [(chainer.optimizer.UpdateRule, "update", rule_update),
                           (chainer.optimizer.Optimizer, "call_hooks", call_hooks)]
        chainer.optimizer.UpdateRule.update = update
        chainer.optimizer.Optimizer.call_hooks = hooks

    def lift(self) -> None:
        """No more calls to ``before_update`` (the first update is under way)."""
        self.lifted = True

    def remove(self) -> None:
        """Put Chainer's own update and hooks back (again: nothing to do)."""
        for owner, name, original in self._originals:
            setattr(owner, name, original)
        self._originals = []
