"""PoocH: profile a few real iterations, classify every feature map, train on with the plan.

    with PoocH(model, profile_iters=3, budget="4GiB") as pooch:
        trainer.run()              # or any loop: loss.backward(); optimizer.update()
    pooch.plan.counts              # {'keep': ..., 'swap': ..., 'recompute': ...}

Iterations are found without the user's help (hooks/graph.py says how). Each graph PoocH meets
(by its signature: ops, shapes, wiring) gets ``profile_iters`` real training iterations, exactly
as plain Chainer runs them, with every feature map swapped (paper 4.2): the first one on demand
(nothing is known yet), the others by the swap-all schedule, so a network larger than the device
can be profiled. Then the policy classifies on the measured profile, a log line says what was
decided, and the graph's iterations replay the plan's schedule. Plans are kept per graph
(``MAX_PLANS``), so a graph that comes back reuses its plan.

The budget (None: the device's capacity) applies from the second profiled iteration on: the
first one runs before anything is known, swapping on demand, and tells the smallest budget any
plan can reach, counting what later iterations hold more (hooks/later_iterations.py: gradients a
loop clears after its forward, the last iteration's tail). The check comes at the end of that
first backward pass (again at each update of that iteration if more passes ran:
``chainer.grad``, then ``backward``; a GAN's generator pass after the discriminator's update): a
budget below the minimum, or one the chosen policy cannot meet, raises BudgetTooSmallError (with
the minimum) out of ``loss.backward()`` (``optimizer.update()``), and every link's parameters,
gradients and persistent state (BatchNormalization statistics) and every optimizer that updated
are put back as they were: nothing changes. A loop PoocH cannot run exactly (double backprop, a
static graph) is refused at the first optimizer update (``UnsupportedLoopError``). An overrun
before the first update (gradients accumulated over iterations) has it check again on what that
iteration measured. After the first update nothing is refused: a policy that cannot plan leaves
the swap-all plan running (or none).

With ``comm`` (ChainerMN) rank 0 decides from all ranks' profiles (pooch_ext/distributed.py).
``encodings="lossless"``: maps stored encoded, ReLUs in place (Gist); "lossy(-fp8)": fp16 (fp8)
too. Variables the user's code holds keep their arrays (only the graph's references are
dropped); the profile measures how long they are held and plans count them kept. ``policy=None``
profiles only: ``pooch.profile``, no plan, the swap-all program goes on.
"""
from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from tqdm import tqdm

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer

from pooch_ext.distributed import AllreduceMeter, Ranks
from pooch_ext.graph_order import GraphOrder
from pooch_ext.errors import (BudgetTooSmallError, PoochError, check_count, check_flag,  # noqa: F401
                              PolicyDoesNotFitError, UnsupportedLoopError)  # noqa: F401  (importable where raised)
from pooch_ext.hooks.chainer_refs import check_chainer
from pooch_ext.hooks.device import device_for
from pooch_ext.hooks.model_state import ModelSnapshot
from pooch_ext.encodings import check_setting, codecs_of
from pooch_ext.encodings import classify as choose_encodings
from pooch_ext.hooks.program import ExecutorError, Program, compile_program
from pooch_ext.trace import GraphTrace
from pooch_ext.hooks.executor import Executor
from pooch_ext.hooks.conv_configs import FirstIterationSplits
from pooch_ext.hooks.profiler import Profiler
from pooch_ext.hooks.scope import Models
from pooch_ext.hooks.update_gate import UpdateGate
from pooch_ext.hooks.runtime_device import RuntimeDevice
from pooch_ext.links import Link, get_link
from pooch_ext.plan import Plan
from pooch_ext.pooch_results import NOTHING_TRAINED, PoochResults
from pooch_ext.refusals import Refusals
from pooch_ext.runtime_profile import runtime_profile
from pooch_ext.policies import check_policy, fitting_plan
from pooch_ext.profile import Profile
from pooch_ext.sim.budgets import resolve_host_budget
from pooch_ext.units import UNLIMITED, parse_bytes

# iterations that update whose stretch after the last op the check sees (the second holds
# what the first left alive beside its replacement): Refusals._check_first_tail
TAIL_CHECKS = 2
log = logging.getLogger("pooch_ext")
MAX_PLANS = 8     # graphs whose plans are kept (the last partial batch, a branch, ...)
RECENT = 64       # a graph without a plan seen in the last RECENT iterations keeps measuring on
_ACTIVE: list["PoocH"] = []       # the PoocH whose ``with`` block is running (at most one)


class PoocH(Refusals, PoochResults):
    """Context manager around a Chainer training loop; see the module docstring."""

    def __init__(self, model: chainer.Link | Sequence[chainer.Link], profile_iters: int = 3,
                 budget: int | str | None = None, link: str | Link = "auto",
                 policy: str | Callable | None = "pooch", device: RuntimeDevice | None = None,
                 verbose: bool = True, host_budget: int | str | None = None,
                 split_convolutions: bool = True, comm: Any = None,
                 encodings: str | None = None) -> None:
        check_chainer()        # a Chainer the runtime was not tested with is refused here
        check_policy(policy)        # an unknown name or a non-callable fails here
        self.models = Models(model)
        if not self.models:     # nothing to count against the budget or put back on refusal
            raise TypeError(f"PoocH needs the model it trains: a chainer Link or a list of "
                            f"Links; got {model!r}")
        self.model = model
        self.profile_iters = check_count("profile_iters", profile_iters)
        self.budget_request = None if budget is None else parse_bytes(budget)
        self.host_budget = resolve_host_budget(host_budget)   # math.inf: unlimited
        self.link = link if isinstance(link, Link) or link == "auto" else get_link(link)
        self.policy = policy
        self.verbose = verbose
        self.split_convolutions = check_flag("split_convolutions", split_convolutions)
        self.encodings = check_setting(encodings)   # one of encodings.SETTINGS
        # data-parallel ranks (a ChainerMN communicator): rank 0 decides for all of them
        self.ranks = Ranks(comm) if comm is not None else None
        self._allreduce: AllreduceMeter | None = None
        self.device = device
        self.profile: Profile | None = None
        self.checked_profile: Profile | None = None   # what the last refusal check ran on
        self.plan: Plan | None = None
        self.program: Program | None = None
        self.budget_bytes: int | None = None
        self.messages: list[str] = []
        self.runtime: Executor | None = None       # the Chainer hook that runs plans
        self.profiler: Profiler | None = None     # attached to it while profiling
        self._graphs: dict[tuple, _Graph] = {}    # signature -> what PoocH knows of it
        self._order = GraphOrder()                  # and the order the graphs come in
        self._deviations: list[str] = []
        self._found_at_start = self._closing = self._budget_applied = self._exiting = False
        self._told: set[Any] = set()             # what was said once
        self._trained = self._checked_passes = 0    # iterations; passes the check saw
        self._checked_graphs: set = set()           # signatures of the graphs it checked
        self._updated = False                       # an optimizer has updated a parameter
        self._updating_ends = 0                     # iterations that updated, ended
        self._refusal: Exception | None = None      # raised before the first update
        self._gate = UpdateGate(self._before_update)  # updates until TAIL_CHECKS iterations end
        self.overruns: list[dict] = []              # budget overruns the CPU device measured

    # ------------------------------------------------------------ context
    def __enter__(self) -> "PoocH":
        if _ACTIVE:
            raise PoochError("PoocH is already active around this code: its hooks see every "
                             "Chainer function in the process, so one PoocH must cover all "
                             "models (PoocH([a, b]) instead of one inside the other)")
        if self.runtime is not None:
            raise PoochError("this PoocH has run its block already (its profiles, plans and "
                             "statistics are that block's): make a new PoocH for another")
        if self.device is None:
            link = None if self.link == "auto" else self.link
            self.device = device_for(self.models, self.budget_request, link)
        self.budget_bytes = (self.budget_request if self.budget_request is not None
                             else self.device.capacity_bytes())
        with self.device.host_side():
            self._snapshot = ModelSnapshot(self.models)
        self.runtime = Executor(self.models, self.device, on_deviation=self._deviated,
                                iteration_done=self._iteration_done,
                                backward_done=self._backward_done,
                                link_added=self._link_added)
        self.profiler = Profiler(self.runtime, codecs_of(self.encodings))
        self.runtime.__enter__()
        _ACTIVE.append(self)
        self._gate.around = self.device.host_side   # an update's temporaries: update_gate.py
        self._gate.on_optimizer = self._remember_optimizer
        self._gate.on_param = self.runtime.update_stamps.updated
        self._gate.install()
        if self.ranks is not None:
            self._allreduce = AllreduceMeter(self.ranks.comm, getattr(self.device, "counter",
                                                                      None))
            self._allreduce.install()
        self._start_profiling()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        _ACTIVE[:] = [active for active in _ACTIVE if active is not self]
        self._gate.remove()
        if self._allreduce is not None:
            self._allreduce.remove()
        try:
            if exc_type is not None:
                self._closing = True
                self.runtime.abandon()
                if not self._updated and issubclass(exc_type, (PoochError, MemoryError)):
                    self._snapshot.restore()    # out of memory on a GPU, say: nothing changed
            self._exiting = True        # an iteration it ends has no next one
            self.runtime.__exit__(exc_type, exc, tb)
            if exc_type is None and not self._trained:
                self._say(NOTHING_TRAINED)
            elif exc_type is None and self.policy is not None and \
                    self._trained <= self.profile_iters * len(self._graphs) and not any(
                    stats.program not in ("", "profile") for stats in self.runtime.history):
                self._say(f"the loop ended before profiling did ({self._trained} training "
                          f"iterations, profile_iters={self.profile_iters}): no plan was made, "
                          "every iteration ran as the profiling ones do; a smaller "
                          "profile_iters plans sooner")
        finally:
            self.profiler.detach()
            self._closing = True
            self.device.restore()

    # ------------------------------------------------------------ phases
    def _say(self, message: str) -> None:
        self.messages.append(message)
        log.info(message)
        if self.verbose and (self.ranks is None or self.ranks.rank == 0):
            tqdm.write(f"PoocH: {message}", file=sys.stderr)   # safe beside progress bars

    def _start_profiling(self) -> None:
        self._first_splits = FirstIterationSplits(self.device, self.budget_bytes,
                                                  self.split_convolutions)
        self.runtime.on_demand_split = self._first_splits.pieces
        self.runtime.on_demand_backward = self._first_splits.backward
        self.runtime.unrecorded_split = self._first_splits.unrecorded if self.split_convolutions else None
        self.runtime.use(None)
        self.profiler.attach()
        self.runtime.catalog = self._programs
        self.runtime.on_unsupported_run = self._unsupported
        self.runtime.on_switch = self._switched
        if self.device.kind == "cpu":
            self.device.enforce = False      # the first iteration runs on demand, unplanned
            self.device.on_overrun = self._overrun

    def _programs(self) -> list[Program]:
        """Every program PoocH holds, most recently used first (the executor may switch)."""
        graphs = sorted(self._graphs.values(), key=lambda g: -g.last_seen)
        return [p for g in graphs for p in (g.program or g.provisional,) if p is not None]

    def _deviated(self, reason: str) -> None:
        self._deviations.append(reason)
        self._measure_if_starting()

    def _switched(self, program: Program) -> None:
        if not any(g.program is program for g in self._graphs.values()):
            self._measure_if_starting()     # a graph still being profiled

    def _measure_if_starting(self) -> None:
        """A graph other than the expected one begins: nothing of the iteration has run yet,
        so it can be measured whole from here on."""
        if len(self.runtime.functions) == 1 and not self.runtime.trace.ops:
            self._found_at_start = True
            self.profiler.attach()

    def _link_added(self, link: chainer.Link) -> None:
        if not self._gate.lifted:   # (after, a copy made per evaluation would be kept)
            with self.device.host_side():
                self._snapshot.add(link, held=False)


    def _iteration_done(self, trace: GraphTrace) -> None:
        if self._closing:
            return
        try:
            with self.device.host_side():
                self._advance(trace)
        except BaseException:
            self._closing = True
            self.runtime.abandon()
            raise

    def _advance(self, trace: GraphTrace) -> None:
        deviations, self._deviations = self._deviations, []
        found_at_start, self._found_at_start = self._found_at_start, False
        if not trace.backward_order or trace.unsupported or trace.failed:
            return              # not a training iteration PoocH can plan (or learn from)
        self._check_first_tail(trace)
        self._trained += 1
        self._updating_ends += self._updated
        if self._updating_ends >= TAIL_CHECKS:     # no refusal comes after these
            self._gate.lift()
            self._gate.on_optimizer = None
            self._snapshot = ModelSnapshot(Models())   # nothing is put back any more
        signature = trace.signature()
        graph = self._graphs.get(signature)
        if graph is None:
            if self._graphs:
                self._say(f"a new graph ({deviations[0] if deviations else 'it changed'}); "
                          "profiling it")
            graph = self._graphs[signature] = _Graph(found_at_start=found_at_start)
            while len(self._graphs) > MAX_PLANS:
                oldest = min(self._graphs, key=lambda s: self._graphs[s].last_seen)
                del self._graphs[oldest]
        graph.last_seen = self._trained
        sample = self.profiler.last_sample
        if not graph.planned and sample is not None and sample.trace is trace:
            graph.samples.append(sample)
            self._plan_graph(graph, trace)
        self._order.saw(signature)      # the next iteration starts on the graph predicted
        upcoming = self._graphs.get(self._order.next(), graph)
        self.runtime.use(upcoming.program or upcoming.provisional)
        # a graph without a plan is measured (the upcoming one too); one met not at an
        # iteration's start (measuring begins on the fly) keeps every iteration measured a while
        if not graph.planned or not upcoming.planned or any(
                not g.planned and not g.found_at_start and
                g.last_seen > self._trained - RECENT for g in self._graphs.values()):
            self.profiler.attach()
        else:
            self.profiler.detach()

    def _plan_graph(self, graph: "_Graph", trace: GraphTrace) -> None:
        """Plan ``graph`` from its samples: a swap-all program to profile with after the
        first, the policy's plan after ``profile_iters``. A policy that cannot plan once
        updates were made leaves the swap-all program running (it ran at this budget)."""
        if len(graph.samples) < self.profile_iters:
            if graph.provisional is None:
                graph.provisional = self._swap_all_program(
                    self._build_profile(graph.samples), trace)
                self._apply_budget()
            return
        profile = self._build_profile(graph.samples)
        graph.planned = True
        if self.policy is None:
            graph.profile = self.profile = profile
            graph.program = graph.provisional or self._swap_all_program(profile, trace)
            self._apply_budget()
            self._say("policy None: profiled, no plan; the swap-all program the profiling ran goes on")
            return
        try:
            _, (profile, plan) = self._agreed(profile, self._classify_encoded)
            program = compile_program(trace, profile, plan.schedule, plan.policy, plan.configs)
        except (BudgetTooSmallError, ExecutorError) as error:
            if graph.provisional is None:
                graph.provisional = self._swap_all_program(profile, trace)
            self._say(f"the {self._policy_name()} plan cannot run ({error}); going on " + (
                "with the swap-all plan the profiling ran" if graph.provisional else
                "unplanned, on demand (where it goes over the budget: PoocH.overruns)"))
            graph.program = graph.provisional
            graph.profile = self.profile = profile
            return
        graph.profile, graph.plan, graph.program = profile, plan, program
        self.profile, self.plan, self.program = profile, plan, program
        self._apply_budget()
        self._say(self.decision())

    def _swap_all_program(self, profile: Profile, trace: GraphTrace) -> Program | None:
        """The swap-all program profiling runs, or None (the graph then runs on demand, its
        overruns recorded) when even swap-all cannot fit: said once, never raised."""
        try:
            profile, plan = self._agreed(profile, lambda agreed: self._classify(agreed, "swap-all"))
        except BudgetTooSmallError as error:
            message = (f"no plan of this graph fits the budget ({error}); it runs unplanned, "
                       "on demand (where it goes over the budget: PoocH.overruns)")
            if message not in self._told:
                self._told.add(message)
                self._say(message)
            return None
        return compile_program(trace, profile, plan.schedule, "profile", plan.configs)

    def _policy_name(self) -> str:
        return self.policy if isinstance(self.policy, str) else getattr(
            self.policy, "__name__", "custom")

    def _apply_budget(self) -> None:
        if self.device.kind == "cpu":
            self.device.set_budget(None if self.budget_bytes >= UNLIMITED else self.budget_bytes)
            self.device.enforce = True
        elif not self._budget_applied and self.budget_request is not None:
            self.device.set_budget(self.budget_request)
        self._budget_applied = True

    # ------------------------------------------------------------ profile and plan
    def _build_profile(self, samples: list) -> Profile:
        return runtime_profile(samples, self.link, self.device, self.models, self.budget_bytes,
                               self.split_convolutions, self._allreduce,
                               not self._in_refusal_window())

    def _agreed(self, profile: Profile, decide: Callable[[Profile], Any]) -> tuple[Profile, Any]:
        """(profile, decide(profile)); with data-parallel ranks, every rank's profile
        combined and the decision made on rank 0, the same on every rank (or its error
        raised on every rank): pooch_ext/distributed.py."""
        if self.ranks is None:
            return profile, decide(profile)
        settings = dict(budget=self.budget_bytes, policy=self._policy_name(),
                        profile_iters=self.profile_iters, host_budget=self.host_budget,
                        split_convolutions=self.split_convolutions, encodings=self.encodings)
        return self.ranks.agree(profile, decide, settings)

    def _classify_encoded(self, profile: Profile) -> tuple[Profile, Plan]:
        """(the profile the plan runs on, the policy's plan, with encodings the fastest over
        the encoding sets pooch_ext/encodings.py tries: never slower than none)."""
        return choose_encodings(profile, lambda target: self._classify(
            target, self.policy, self.host_budget), self.encodings)

    def _classify(self, profile: Profile, policy: str | Callable,
                  host_budget: float = math.inf) -> Plan:
        """``host_budget`` binds the policy's plan, not the swap-all plan profiling runs."""
        return fitting_plan(profile, policy, self.budget_bytes, host_budget)


@dataclass
class _Graph:
    """One graph PoocH has met: its measured iterations and, once planned, its program."""

    samples: list = field(default_factory=list)
    profile: Profile | None = None
    plan: Plan | None = None
    program: Program | None = None
    provisional: Program | None = None   # the swap-all program the profiling runs
    last_seen: int = 0
    found_at_start: bool = False         # first met at an iteration's first op
    planned: bool = False                # its profile is complete and its plan decided
