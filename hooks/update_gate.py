"""The update gate: the one moment to refuse a training run without changing anything.

Until the first update, every optimizer first calls ``before_update``: the moment when every
backward pass of the iteration has run, Chainer's own errors included, and no parameter,
step count or optimizer state has changed yet (PoocH raises a refusal there, with the models
as they were). Both the optimizer's 'pre' hooks (run before its step count moves) and each
update rule (for optimizers without them) are gated; the caller lifts the gate (``remove``)
at the first call.
"""
from __future__ import annotations

from typing import Any, Callable

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer


class UpdateGate:
    """Calls ``before_update()`` ahead of every optimizer update while installed."""

    def __init__(self, before_update: Callable[[], None]) -> None:
        self.before_update = before_update
        self._originals: list[tuple[Any, str, Any]] = []

    def install(self) -> None:
        if self._originals:
            return
        rule_update = chainer.optimizer.UpdateRule.update
        call_hooks = chainer.optimizer.Optimizer.call_hooks
        gate = self

        def update(rule: Any, param: Any) -> Any:
            gate.before_update()
            return rule_update(rule, param)

        def hooks(optimizer: Any, timing: str = "pre") -> Any:
            if timing == "pre":
                gate.before_update()
            return call_hooks(optimizer, timing)
        self._originals = [(chainer.optimizer.UpdateRule, "update", rule_update),
                           (chainer.optimizer.Optimizer, "call_hooks", call_hooks)]
        chainer.optimizer.UpdateRule.update = update
        chainer.optimizer.Optimizer.call_hooks = hooks

    def remove(self) -> None:
        """Put Chainer's own update and hooks back (again: nothing to do)."""
        for owner, name, original in self._originals:
            setattr(owner, name, original)
        self._originals = []
