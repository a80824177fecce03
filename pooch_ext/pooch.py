"""PoocH: profile a few real iterations, classify every feature map, train on with the plan.

    with PoocH(model, profile_iters=3, budget="4GiB") as pooch:
        trainer.run()              # or any loop: loss.backward(); optimizer.update()
    pooch.plan.counts              # {'keep': ..., 'swap': ..., 'recompute': ...}

Iterations are found without the user's help (a forward after a backward starts a new one).
The first ``profile_iters`` iterations are real training iterations, exactly as plain Chainer
runs them, with every feature map swapped (paper 4.2): the first one on demand (nothing is
known yet), the others by the swap-all schedule, so a network larger than the device can be
profiled. Then the policy classifies on the measured profile, a log line says what was
decided, and the following iterations replay the plan's schedule. If the graph changes (other
shapes or ops), the plan is dropped for that iteration and PoocH profiles again.

The budget (None: the device's capacity) applies from the second profiled iteration on: the
first one runs before anything is known, swapping on demand, and tells the smallest budget
any plan can reach. The check comes at the end of that first backward pass, before the
optimizer's update: a budget below the minimum, or one the chosen policy cannot meet on the
first iteration's measurements, raises BudgetTooSmallError (with the minimum) out of
``loss.backward()``, and the model's parameters, gradients and persistent state
(BatchNormalization statistics) are put back as they were when the ``with`` block began, so
the failed attempt changes nothing. (Should the policy fail only on the final profile, the
error comes after profiling, leaving the state plain training would have.)

Arrays of intermediate Variables the user's code still holds are dropped while a plan needs
their memory (after their last forward use) and put back before backward reads them; after
their last use they are left to the user, as plain Chainer would.
"""
from __future__ import annotations

import logging
import sys
from typing import Any, Callable

import pandas as pd
from tqdm import tqdm

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer

from pooch_ext.errors import BudgetTooSmallError
from pooch_ext.hooks.device import (UNLIMITED, HostSimDevice, device_for, host_copy,
                                    persistent_values, resident_bytes)
from pooch_ext.hooks.executor import Program, compile_program
from pooch_ext.hooks.graph import GraphTrace
from pooch_ext.hooks.profiler import Profiler, build_profile, fit_link
from pooch_ext.links import Link, get_link
from pooch_ext.plan import Plan
from pooch_ext.policies import get_policy
from pooch_ext.profile import Device, Profile
from pooch_ext.simulator import minimum_budget
from pooch_ext.units import format_bytes, parse_bytes

log = logging.getLogger("pooch_ext")
MAX_REPROFILES = 3


class PoocH:
    """Context manager around a Chainer training loop; see the module docstring."""

    def __init__(self, model: chainer.Link, profile_iters: int = 3,
                 budget: int | str | None = None, link: str | Link = "auto",
                 policy: str | Callable | None = "pooch", device: Any = None,
                 verbose: bool = True) -> None:
        if int(profile_iters) < 1:
            raise ValueError(f"profile_iters must be >= 1, got {profile_iters}")
        if isinstance(policy, str):
            get_policy(policy)                     # unknown names fail here, listing the known
        self.model = model
        self.profile_iters = int(profile_iters)
        self.budget_request = None if budget is None else parse_bytes(budget)
        self.link = link if isinstance(link, Link) or link == "auto" else get_link(link)
        self.policy = policy
        self.verbose = verbose
        self.device = device
        self.profile: Profile | None = None
        self.plan: Plan | None = None
        self.program: Program | None = None
        self.budget_bytes: int | None = None
        self.messages: list[str] = []
        self.runtime: Profiler | None = None
        self._phase = "profile"
        self._profiled = 0
        self._reprofiles = 0
        self._reprofile_reason = ""
        self._closing = False
        self._budget_applied = False

    # ------------------------------------------------------------ context
    def __enter__(self) -> "PoocH":
        if self.device is None:
            link = None if self.link == "auto" else self.link
            self.device = device_for(self.model, self.budget_request, link)
        self.budget_bytes = (self.budget_request if self.budget_request is not None
                             else self.device.capacity_bytes())
        self._snapshot = ModelSnapshot(self.model)
        self.runtime = Profiler(self.model, self.device, on_deviation=self._deviated,
                                iteration_done=self._iteration_done,
                                backward_done=self._backward_done)
        self.runtime.__enter__()
        self._start_profiling()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        runtime = self.runtime
        try:
            if exc_type is not None:
                self._closing = True
                runtime.abandon()
            runtime.__exit__(exc_type, exc, tb)
        finally:
            self._closing = True
            self.device.restore()

    # ------------------------------------------------------------ phases
    def _say(self, message: str) -> None:
        self.messages.append(message)
        log.info(message)
        if self.verbose:
            tqdm.write(f"PoocH: {message}", file=sys.stderr)   # safe beside progress bars

    def _start_profiling(self) -> None:
        self._phase = "profile"
        self._profiled = 0
        self.runtime.samples = []
        self.runtime.use(None)
        self.runtime.start_measuring()
        if isinstance(self.device, HostSimDevice):
            self.device.enforce = False      # the first iteration runs on demand, unplanned

    def _deviated(self, reason: str) -> None:
        self._reprofile_reason = reason

    def _backward_done(self, trace: GraphTrace) -> None:
        """End of the first backward pass: refuse an impossible budget before any update."""
        if self._closing or self._phase != "profile" or self._profiled != 0 or \
                self._reprofiles != 0:
            return
        try:
            provisional = self._build_profile([self.runtime.current_sample(trace)])
            self._check_fits(provisional)
        except BaseException:
            self._closing = True
            self.runtime.abandon()
            self._snapshot.restore()
            raise

    def _check_fits(self, profile: Profile) -> None:
        floor = minimum_budget(profile)
        if self.budget_bytes < floor:
            raise BudgetTooSmallError(self.budget_bytes, floor, profile.meta.get("model", ""))
        self._classify(profile, self.policy if self.policy is not None else "swap-all")

    def _iteration_done(self, trace: GraphTrace) -> None:
        if self._closing:
            return
        try:
            self._advance(trace)
        except BaseException:
            self._closing = True
            self.runtime.abandon()
            raise

    def _advance(self, trace: GraphTrace) -> None:
        if not trace.backward_order:
            # forward ops without a backward (a metric computed after the update, the tail of
            # a loop): not a training iteration, nothing to learn from it
            self._reprofile_reason = ""
            return
        if self._reprofile_reason:
            reason, self._reprofile_reason = self._reprofile_reason, ""
            if self._reprofiles >= MAX_REPROFILES:
                if self._phase != "on-demand":
                    self._say(f"the graph changed again ({reason}); it changes too often to "
                              "plan, so PoocH goes on swapping unreferenced maps on demand")
                self._phase = "on-demand"
                self.runtime.use(None)
                self.runtime.stop_measuring()
                return
            self._reprofiles += 1
            self._say(f"the graph changed ({reason}); profiling again")
            self._start_profiling()
            return
        if self._phase != "profile":
            return
        self._profiled += 1
        if self._profiled == 1 and self.profile_iters > 1:
            # from now on the profiled iterations replay the swap-all schedule
            provisional = self._build_profile(self.runtime.samples)
            plan = self._classify(provisional, "swap-all")
            self.runtime.use(compile_program(trace, provisional, plan.schedule, "profile"))
            self._apply_budget()
        if self._profiled >= self.profile_iters:
            self.profile = self._build_profile(self.runtime.samples)
            self.runtime.stop_measuring()
            self._phase = "execute"
            if self.policy is None:
                self._apply_budget()
                return
            self.plan = self._classify(self.profile, self.policy)
            self.program = compile_program(trace, self.profile, self.plan.schedule,
                                           self.plan.policy)
            self.runtime.use(self.program)
            self._apply_budget()
            self._say(self.decision())

    def _apply_budget(self) -> None:
        if isinstance(self.device, HostSimDevice):
            self.device.set_budget(None if self.budget_bytes >= UNLIMITED else self.budget_bytes)
            self.device.enforce = True
        elif not self._budget_applied and self.budget_request is not None:
            self.device.set_budget(self.budget_request)
        self._budget_applied = True

    # ------------------------------------------------------------ profile and plan
    def _build_profile(self, samples: list) -> Profile:
        trace = samples[-1].trace
        link = self.link if isinstance(self.link, Link) else None
        if link is None:
            link = (self.device.link if isinstance(self.device, HostSimDevice)
                    else fit_link(samples[1:] or samples) or get_link("pcie3"))
        measured = not isinstance(self.device, HostSimDevice) and self.link == "auto"
        batch = next((t.shape[0] for t in trace.tensors if t.producer < 0 and t.shape), None)
        meta = {"model": type(self.model).__name__, "batch": batch,
                "device_kind": self.device.kind}
        device = Device(self.device.name, int(self.budget_bytes), self.device.kind)
        return build_profile(samples, device, link, resident_bytes(self.model), meta,
                             measured_swaps=measured)

    def _classify(self, profile: Profile, policy: str | Callable) -> Plan:
        """``policy``: a policy name, or any ``classify(profile, budget, link) -> Plan``."""
        classify = get_policy(policy).classify if isinstance(policy, str) else policy
        plan = classify(profile, self.budget_bytes, None)
        if not plan.feasible:
            raise PolicyDoesNotFitError(self.budget_bytes, plan, minimum_budget(profile))
        return plan

    # ------------------------------------------------------------ results
    @property
    def phase(self) -> str:
        """'profile' while profiling, 'execute' once a plan runs, 'on-demand' if it gave up."""
        return self._phase

    @property
    def timeline(self) -> Any:
        """The simulator's Timeline of the plan being executed (None before classification)."""
        return None if self.plan is None else self.plan.timeline

    def decision(self) -> str:
        """One line: what was decided, what it is predicted to cost."""
        plan, profile = self.plan, self.profile
        counts = plan.counts
        incore_s = float(profile.ops.duration_s.sum())
        return (f"{plan.policy} plan for {profile.meta.get('model', 'the model')}: "
                f"keep {counts['keep']} / swap {counts['swap']} / recompute {counts['recompute']} "
                f"feature maps; predicted {plan.iteration_time_s * 1e3:.1f} ms per iteration "
                f"(in-core {incore_s * 1e3:.1f} ms), peak {format_bytes(plan.peak_bytes)} of a "
                f"{format_bytes(self.budget_bytes)} budget (in-core needs "
                f"{format_bytes(profile.incore_peak_bytes)}); classified in "
                f"{plan.classify_seconds:.2g} s")

    @property
    def iterations(self) -> pd.DataFrame:
        """Per iteration: phase, measured seconds, accounted peak, what the executor did."""
        history = self.runtime.history if self.runtime is not None else []
        rows = []
        for position, stats in enumerate(history):
            following = history[position + 1].started if position + 1 < len(history) else None
            rows.append(dict(
                iteration=stats.iteration, program=stats.program or "on-demand",
                wall_s=(following - stats.started) if following else float("nan"),
                compute_s=max(0.0, stats.finished - stats.started) if stats.finished else float("nan"),
                peak_bytes=stats.peak_bytes, swap_outs=stats.swap_outs, swap_ins=stats.swap_ins,
                recomputes=stats.recomputes, frees=stats.frees, on_demand=stats.on_demand,
                deviation=stats.deviation))
        return pd.DataFrame(rows)

    @property
    def allocations(self) -> pd.DataFrame:
        """The device's malloc/free events of the profiled iterations, in program order, each
        attributed to the op running (-1 between ops; backward ops have their own index)."""
        from pooch_ext.hooks.allocator import EVENT_COLUMNS

        rows = [(s.iteration,) + tuple(e) for s in self.runtime.samples for e in s.allocations]
        return pd.DataFrame(rows, columns=["iteration", *EVENT_COLUMNS])

    def extension(self) -> Any:
        """A Trainer extension reporting pooch/* entries every iteration (for PrintReport)."""
        return PoocHReport(self)


class ModelSnapshot:
    """Host copies of what a failed PoocH attempt could change in the model: parameters, their
    gradients (Chainer may write into a gradient array it reuses) and persistent values
    (BatchNormalization running statistics)."""

    def __init__(self, model: chainer.Link) -> None:
        self.params = [(p, host_copy(p.array),
                        (p._grad_valid, host_copy(p._grad_var.array) if p._grad_valid
                         and p._grad_var is not None else None))
                       for p in model.params()]
        self.persistent = [(link, name, host_copy(value) if hasattr(value, "shape") else value)
                           for _, link, name, value in persistent_values(model)]

    @staticmethod
    def _put(current: Any, saved: Any) -> Any:
        """``saved`` back into ``current`` in place when possible, else on its device."""
        if current is None or saved is None or not hasattr(current, "shape") or \
                current.shape != saved.shape:
            return saved if current is None or saved is None else \
                chainer.backend.get_device_from_array(current).send(saved)
        current[...] = chainer.backend.get_device_from_array(current).send(saved)
        return current

    def restore(self) -> None:
        """Put the snapshot back into the model (arrays in place where the shapes agree)."""
        for param, array, (grad_valid, grad) in self.params:
            # a lazily initialised parameter the failed attempt initialised goes back to None
            param.array = None if array is None else self._put(param.array, array)
            param.grad = None if grad is None or param.array is None else \
                chainer.backend.get_device_from_array(param.array).send(grad)
            param._grad_valid = grad_valid
        for link, name, value in self.persistent:
            current = link.__dict__[name]
            link.__dict__[name] = self._put(current, value) if hasattr(value, "shape") else value


class PolicyDoesNotFitError(BudgetTooSmallError):
    """The chosen policy has no plan within the budget, though another policy may have one;
    ``minimum_bytes`` is what this policy's plan needs."""

    def __init__(self, budget: int, plan: Plan, floor: int) -> None:
        need = max(int(plan.peak_bytes), floor)
        super().__init__(budget, need, plan.policy)
        self.args = (f"policy {plan.policy} cannot fit the budget {format_bytes(budget)}: "
                     f"{plan.reason}; its plan needs {format_bytes(need)} ({need} bytes), the "
                     f"smallest budget any plan reaches is {format_bytes(floor)}",)


class PoocHReport(chainer.training.Extension):
    """Reports ``pooch/profiling`` (1 while profiling), ``pooch/peak_mib`` (accounted device
    peak), ``pooch/compute_s`` (forward + backward seconds) and the executor's action counts."""

    trigger = (1, "iteration")
    priority = chainer.training.PRIORITY_WRITER
    name = "PoocHReport"

    def __init__(self, pooch: PoocH) -> None:
        self.pooch = pooch

    def __call__(self, trainer: Any) -> None:
        runtime = self.pooch.runtime
        if runtime is None or runtime.stats.iteration < 0:
            return
        stats = runtime.stats
        chainer.reporter.report({
            "pooch/profiling": float(self.pooch.phase == "profile"),
            "pooch/peak_mib": runtime.device.peak / 2**20,
            "pooch/compute_s": max(0.0, stats.finished - stats.started),
            "pooch/swaps": float(stats.swap_outs),
            "pooch/recomputes": float(stats.recomputes),
        })

