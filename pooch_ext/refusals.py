"""The moments PoocH may refuse a training run, and what it checks there (a mixin of
pooch.PoocH): the end of the first backward pass, each update of the first iteration, an
unsupported loop found before the first update, the end of the first two iterations that
update (what ran after their last op). A refusal puts back parameters, gradients
and optimizers (the snapshot PoocH took), so the failed attempt changes nothing; none comes
after the second iteration that updates."""
from __future__ import annotations

import math
from typing import Any

from pooch_ext.errors import BudgetTooSmallError, UnsupportedLoopError
from pooch_ext.hooks.executor import AFTER_LAST_OP
from pooch_ext.hooks.measured_profile import SLACK_BYTES
from pooch_ext.units import format_bytes
from pooch_ext.policies import refuse_below_floor
from pooch_ext.profile import Profile
from pooch_ext.trace import GraphTrace


class Refusals:
    """PoocH's refusal checks; PoocH gives the state they read (runtime, profiler, budget,
    policy, snapshot, overruns, ranks) and ``_build_profile`` / ``_agreed`` / ``_classify``."""

    def _in_refusal_window(self) -> bool:
        """The first training iteration under PoocH, whose updates a refusal can undo (each
        optimizer is snapshotted as it first updates: ``_remember_optimizer``)."""
        return not self._closing and self._trained == 0

    def _before_update(self) -> None:
        """Each update while the gate is down (the first two iterations that update): checks
        again what ran since the last check (later backward passes, a GAN's generator pass
        after the discriminator's update; an overrun before any update, or in the second
        updating iteration: a graph first met there, run on demand over the budget, such as
        a GRU given the state the first iteration made, 1.8% over, checked and classified
        again; a graph already checked, named by what it held, not classified again) and
        refuses, putting back parameters, gradients and optimizers."""
        refusal, self._refusal = self._refusal, None
        trace = self.runtime.trace
        held = self._held_at_overruns() if self._updated else []
        checked = bool(trace) and trace.signature() in self._checked_graphs
        overran = bool(self.overruns) if not self._updated else bool(   # _overrun
            trace and not checked and held)
        if refusal is None and held and checked and self.ranks is None:
            # a checked graph's second run over the budget (a frozen encoder cut off by
            # ``unchain()``: 5.3% over, every iteration): what it held, not re-planned, and
            # the per-op slack of a profile (a budget changes what is kept, by a little)
            refusal = BudgetTooSmallError(self.budget_bytes, max(held) + SLACK_BYTES,
                                          "what this loop held in its second updating iteration")
        if refusal is None and trace and (trace.passes > self._checked_passes or overran):
            if overran and self.runtime.profiler is not self.profiler:   # ran unmeasured:
                refusal = BudgetTooSmallError(                          # what it held, then
                    self.budget_bytes, max(o["held_bytes"] for o in self.overruns),
                    "what this loop held before an update")
            else:
                self.profiler.backward_complete(every_pass=True)   # what later passes hold
                refusal = self._refusal_for(trace, overran)
                if refusal is None and overran and self._updated and self.ranks is None:
                    # a plan fits the new graph from now on, but its first run, on demand,
                    # went over: the budget it held is the least this loop runs in
                    refusal = BudgetTooSmallError(self.budget_bytes, max(held),
                                                  "what this loop held where its graph changed")
        self._updated = True
        if refusal is not None and not self._closing:
            self._refuse(refusal)

    def _check_first_tail(self, trace: GraphTrace) -> None:
        """The end of each of the first two iterations that updated (the gate is still down,
        ``TAIL_CHECKS``): what ran after the last op (the update, the loop's own code, the
        next batch) has no plan and every later iteration runs it again, so where it held
        more than the budget no plan keeps the run within it: refused here, the updates put
        back, naming what it held (measured: a loop that keeps ``x`` while it makes the next
        batch holds one batch more there than at any op; a user's MLP went 33% over, every
        iteration, at the minimum the end of backward had named). The second such stretch
        also holds what the first left alive beside its replacement (evaluation outputs kept
        by name: a user's logits, every later iteration 2.1% over the first's need), which
        the first cannot tell from what the next forward replaces (a model's last attention
        weights). The iterator and the loop's own counters have moved on (as at any
        refusal); models and optimizers are as before. Where the block ends with that
        iteration, no later one runs it: recorded, not refused."""
        if self._closing or not self._updated or self._gate.lifted:
            return
        held = self._held_at_overruns(after_last_op=True)
        sample = self.profiler.last_sample
        if sample is not None and sample.trace is trace and sample.after_last_op is not None:
            held.append(sample.after_last_op)
        if self.profiler.head_rise:     # a forward-only pass, run again beside what is left
            held.append(self.profiler.head_rise + self.device.used_bytes())
        worst = max(held, default=0)
        if self.ranks is not None:          # every rank refuses, or none
            worst = self.ranks.most(worst)
        if worst > self.budget_bytes and self._exiting:
            # the block ends with this iteration: nothing runs it again, and the update stays
            self._overrun(f"the device held {format_bytes(worst)} ({worst} bytes) > budget "
                          f"{format_bytes(self.budget_bytes)} at {AFTER_LAST_OP}", worst)
        elif worst > self.budget_bytes:
            self._refuse(BudgetTooSmallError(
                self.budget_bytes, worst,
                f"{self._model_name()} with what this loop holds after its first updates, "
                "before the next forward's graph (the update, the loop's own code, the next "
                "batch, a forward pass no backward reaches: no plan runs there)"),
                in_iteration=False)

    def _held_at_overruns(self, after_last_op: bool = False) -> list[int]:
        """The bytes held at each overrun of the iteration in progress (``after_last_op``:
        only those after its last op, once an update ran)."""
        return [o["held_bytes"] for o in self.overruns
                if o["iteration"] == self.runtime.iteration and (not after_last_op or (
                    not o["before_update"] and AFTER_LAST_OP in o["message"]))]

    def _model_name(self) -> str:
        return (self.checked_profile.meta.get("model", "the model")
                if self.checked_profile is not None else "the model")

    def _remember_optimizer(self, optimizer: Any) -> None:
        """Snapshot an optimizer about to update in the first iteration (a refusal undoes it)."""
        with self.device.host_side():
            self._snapshot.add_optimizer(optimizer)

    def _refuse(self, error: BaseException, in_iteration: bool = True) -> None:
        """Raise ``error`` with everything put back as it was before PoocH began
        (``in_iteration``: maps of the graph in progress too; not once it has ended)."""
        self._closing = True
        self.runtime.abandon(restore=in_iteration)
        self._snapshot.restore()
        raise error

    def _overrun(self, message: str, held: int) -> None:
        """The CPU device measured more than the budget: recorded, said once; the step goes
        on. Before any update (a loop that accumulates gradients over several iterations
        first) the update checks the budget again, on what that iteration measured
        (``_before_update``): refused there, nothing has changed."""
        self.overruns.append(dict(iteration=self.runtime.iteration, message=message,
                                  held_bytes=held, budget_bytes=self.budget_bytes,
                                  before_update=not self._updated))
        early = not self._updated
        if ("overrun", early) not in self._told:
            self._told.add(("overrun", early))
            self._say(f"{message}: " + ("the first update checks the budget again on what "
                                        "this iteration measured" if early else
                                        f"{self.overrun_cause(message)}; training goes on "
                                        "(see PoocH.overruns)"))

    def _unsupported(self, reason: str) -> None:
        if self._in_refusal_window() and not self._updated:
            self._refusal = UnsupportedLoopError(
                f"PoocH cannot run this training loop exactly: {reason}")
            return                          # raised before the first update
        if reason not in self._told:
            self._told.add(reason)
            self._say(f"cannot plan an iteration: {reason}; such iterations run as plain "
                      "Chainer does (no budget)")

    def _backward_done(self, trace: GraphTrace) -> None:
        """End of the first backward pass: refuse what cannot work, before any update (a
        loop found unsupported as such, not for its budget: that refusal had named a minimum
        the loop never runs in; else it is refused at the update, as before, so Chainer's
        own error in between is not hidden)."""
        if (refusal := self._refusal_for(trace)) is not None:
            refusal, self._refusal = self._refusal or refusal, None
            self._refuse(refusal)

    def _refusal_for(self, trace: GraphTrace, overran: bool = False) -> BaseException | None:
        """Why the iteration so far says this run cannot work (None: it can), on a profile of
        what it measured: in the first iteration, or in one that ``overran`` the budget
        before the gate lifts (before the first update, or a graph first met in the second
        updating iteration)."""
        window = self._in_refusal_window() or (overran and not self._gate.lifted)
        if not window or self._closing or trace.unsupported:
            return None                     # an unsupported loop is refused at the update
        self._checked_passes = trace.passes
        self._checked_graphs.add(trace.signature())
        try:
            with self.device.host_side():   # planning data is the host's, not the device's
                self.checked_profile = self._build_profile(     # settled as its end will be
                    [self.profiler.current_sample(self.runtime.settled(trace))])
                self._agreed(self.checked_profile, self._check_fits)
        except BaseException as error:
            return error
        return None

    def _check_fits(self, profile: Profile) -> None:
        policy, host = ((self.policy, self.host_budget) if self.policy is not None
                        else ("swap-all", math.inf))
        refuse_below_floor(profile, policy, self.budget_bytes, host)
        self._classify(profile, policy, host)
