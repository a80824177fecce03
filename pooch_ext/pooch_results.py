"""What a PoocH run tells its user (mixed into PoocH): the phase, the decision in one line,
per-iteration figures, the profiled allocations, a Trainer extension."""
from __future__ import annotations

from typing import Any

import pandas as pd

from pooch_ext.units import format_bytes

ITERATION_COLUMNS = ["iteration", "program", "wall_s", "compute_s", "peak_bytes", "swap_outs",
                     "swap_ins", "recomputes", "frees", "splits", "on_demand", "room_releases",
                     "deviation"]


# said at the end of a ``with PoocH`` block in which no training iteration ran (prediction
# only, say): the budget is checked on training iterations, so nothing was
NOTHING_TRAINED = ("no training iteration ran (a forward pass, then backward): nothing was "
                   "profiled, planned or checked against the budget")


class PoochResults:
    """PoocH's read-only views of its plan and runtime (``plan``, ``profile``, ``runtime``,
    ``profiler``, ``budget_bytes`` and ``_graphs`` are PoocH's)."""

    plan: Any
    profile: Any
    runtime: Any
    profiler: Any
    budget_bytes: Any
    _graphs: dict

    @property
    def phase(self) -> str:
        """'profile' while the graph running now has no plan yet, 'execute' once it has."""
        program = self.runtime.program if self.runtime is not None else None
        return "execute" if program is not None and any(
            g.program is program for g in self._graphs.values()) else "profile"

    @property
    def timeline(self) -> Any:
        """The simulator's Timeline of the plan being executed (None before classification)."""
        return None if self.plan is None else self.plan.timeline

    def decision(self) -> str:
        """One line: what was decided, what it is predicted to cost (or that no plan was
        made: ``policy=None``, a refusal, a graph never seen twice)."""
        plan, profile = self.plan, self.profile
        if plan is None or profile is None:
            return "no plan: " + ("policy=None profiles only" if self.policy is None else
                                  "no graph was planned (PoocH.messages says why)")
        counts = plan.counts
        incore_s = profile.incore_time_s
        gist = ([f"{len(plan.encodings)} stored encoded"] if plan.encodings else []) + \
            ([f"{len(plan.inplace)} ReLU{'s' if len(plan.inplace) > 1 else ''} in place"]
             if plan.inplace else [])
        return (f"{plan.policy} plan for {profile.meta.get('model', 'the model')}: "
                f"keep {counts['keep']} / swap {counts['swap']} / recompute {counts['recompute']} "
                f"feature maps{' (' + ', '.join(gist) + ')' if gist else ''}; "
                f"predicted {plan.iteration_time_s * 1e3:.1f} ms per iteration "
                f"(in-core {incore_s * 1e3:.1f} ms), peak {format_bytes(plan.peak_bytes)} of a "
                f"{format_bytes(self.budget_bytes)} budget (in-core needs "
                f"{format_bytes(profile.incore_peak_bytes)}); classified in "
                f"{plan.classify_seconds:.2g} s")

    def overrun_cause(self, message: str) -> str:
        """Why the device held more than the budget (``message``: the device's), for the log:
        code no plan covers, a skipped batch's graph brought back, a graph run without its
        plan, or a plan's prediction short."""
        from pooch_ext.hooks.executor import AFTER_LAST_OP

        runtime = self.runtime
        if AFTER_LAST_OP in message:
            return ("what ran after the iteration's last op has no plan (the update, or the "
                    "loop's own code: an evaluation, the next batch)")
        if runtime is not None and runtime.kept_forward:
            return ("a forward pass the loop ran without backward (a skipped batch?) is still "
                    "referenced, so what the plan took off the device of it came back, beside "
                    "this iteration: drop the loss (del) before the next batch")
        if runtime is None or runtime.program is None or runtime.deviation or runtime.passive:
            return "this part of the iteration ran without a plan"
        return "the plan's prediction was short"

    @property
    def iterations(self) -> pd.DataFrame:
        """Per iteration: phase, measured seconds, accounted peak, what the executor did."""
        history = self.runtime.history if self.runtime is not None else []
        rows = []
        for position, stats in enumerate(history):
            following = history[position + 1].started if position + 1 < len(history) else None
            rows.append(dict(
                iteration=stats.iteration,   # off its plan: on demand (deviation says why)
                program="on-demand" if stats.deviation or not stats.program else stats.program,
                wall_s=(following - stats.started) if following else float("nan"),
                compute_s=max(0.0, stats.finished - stats.started) if stats.finished else float("nan"),
                peak_bytes=stats.peak_bytes, swap_outs=stats.swap_outs, swap_ins=stats.swap_ins,
                recomputes=stats.recomputes, frees=stats.frees, splits=len(stats.splits),
                on_demand=stats.on_demand, room_releases=stats.room_releases,
                deviation=stats.deviation))
        return pd.DataFrame(rows, columns=ITERATION_COLUMNS)   # the columns even when empty

    @property
    def allocations(self) -> pd.DataFrame:
        """The device's malloc/free events of the profiled iterations, in program order, each
        attributed to the op running (-1 between ops; backward ops have their own index).
        Empty on the CPU device with its counting allocator (it counts bytes, not blocks)."""
        from pooch_ext.hooks.allocator import EVENT_COLUMNS

        samples = self.profiler.samples if self.profiler is not None else []
        rows = [(s.iteration,) + tuple(e) for s in samples for e in s.allocations]
        return pd.DataFrame(rows, columns=["iteration", *EVENT_COLUMNS])

    def extension(self) -> Any:
        """A Trainer extension reporting pooch/* entries every iteration (for PrintReport)."""
        from pooch_ext.trainer_report import PoocHReport

        return PoocHReport(self)
