"""Check a schedule on its own: its invariants, and the memory it implies at every boundary.

The simulator writes the schedule and the executor replays it; both sides test against these
two functions, which read only the profile and the schedule (never the simulator's state), so
a schedule that passes here is safe to replay and uses exactly the memory reported here.

Independent on purpose: the engine derives memory from its own boundary loop, this checker
from the schedule's actions alone; both apply the one rule of sim/memory.py, and the tests
demand equal peaks for every policy, so a bug on either side shows as a disagreement.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from pooch_ext.plan import ACTIONS, Plan
from pooch_ext.profile import Profile
from pooch_ext.sim.configs import applied
from pooch_ext.sim.memory import levels_from_changes, tops
from pooch_ext.sim.model import compile_profile

_ALLOWED = {"keep": {"free"}, "swap": {"swap_out", "release", "swap_in", "wait", "free"},
            "recompute": {"free", "recompute"}}


def validate_schedule(profile: Profile, plan_or_schedule: Plan | pd.DataFrame) -> list[str]:
    """Problems with the schedule ([] when sound), each naming the boundary and the tensor.

    Invariants: actions and tensors are known; a map is swapped out only after its producer,
    released only after a swap-out, swapped in only while absent and saved on the host;
    every op (forward or backward) and every recompute finds the maps it reads present and,
    after a swap-in, waited for; every map is dropped exactly once per device copy and is
    absent at the end; with a Plan, each map gets only the actions its class allows.
    """
    plan: Plan | None = None
    if isinstance(plan_or_schedule, Plan):
        plan, schedule = plan_or_schedule, plan_or_schedule.schedule
    else:
        schedule = plan_or_schedule
    fms = profile.feature_maps.set_index("tensor")
    malformed = _malformed(schedule, set(int(t) for t in fms.index), profile.n_ops)
    if malformed:
        return malformed
    replay = _Replay(profile, fms)
    if plan is not None:
        replay.problems += _beyond_class(plan, schedule)
    by_boundary = {b: g.sort_values("order") for b, g in schedule.groupby("boundary")}
    for b in range(profile.n_ops + 1):
        group = by_boundary.get(b)
        if group is not None:
            for action, t in zip(group["action"], group["tensor"]):
                replay.act(b, action, int(t))
        if b < profile.n_ops:
            replay.op(b)
    return replay.finish()


def _malformed(schedule: pd.DataFrame, feature_maps: set[int], n: int) -> list[str]:
    """What makes a schedule unreadable: unknown actions, tensors that are not feature maps,
    boundaries outside 0..n (checked before anything else, each alone)."""
    unknown = set(schedule["action"]) - set(ACTIONS)
    if unknown:
        return [f"unknown action(s) {sorted(unknown)}"]
    strangers = set(int(t) for t in schedule["tensor"]) - feature_maps
    if strangers:
        return [f"tensor(s) {sorted(strangers)[:5]} are not feature maps"]
    if len(schedule) and (schedule["boundary"].min() < 0 or schedule["boundary"].max() > n):
        return [f"boundaries must lie in 0..{n}"]
    return []


def _beyond_class(plan: Plan, schedule: pd.DataFrame) -> list[str]:
    """The first action a map's class does not allow (a keep swapped, ...), if any."""
    for t, action in zip(schedule["tensor"], schedule["action"]):
        cls = plan.classes.get(int(t), "keep")
        if action not in _ALLOWED[cls]:
            return [f"tensor {t} is {cls} but the schedule has '{action}' for it"]
    return []


class _Replay:
    """Each feature map's state (present on the device, ready after a swap-in's wait, saved
    on the host, device copies made and dropped) through the schedule, op by op."""

    MAX_PROBLEMS = 20

    def __init__(self, profile: Profile, fms: pd.DataFrame) -> None:
        self.problems: list[str] = []
        self.present = {int(t): False for t in fms.index}
        self.ready = dict(self.present)
        self.on_host = dict(self.present)
        self.drops = {t: 0 for t in self.present}
        self.copies = {t: 0 for t in self.present}
        self.produced_by: dict[int, list[int]] = {}
        for t, p in zip(fms.index, fms["producer"]):
            self.produced_by.setdefault(int(p), []).append(int(t))
        self.sources = {int(t): [int(s) for s in srcs if s in self.present]
                        for t, srcs in zip(fms.index, fms["recompute_sources"])}
        self.needs = list(profile.ops["needs"])

    def say(self, b: int, text: str) -> None:
        if len(self.problems) < self.MAX_PROBLEMS:
            self.problems.append(f"boundary {b}: {text}")

    def act(self, b: int, action: str, t: int) -> None:
        """One action at boundary b: check what it requires, then change t's state."""
        present, ready = self.present, self.ready
        if action == "swap_out":
            if not (present[t] and ready[t]) or self.on_host[t]:
                self.say(b, f"swap_out of {t}: must be present, ready and not yet on the host")
            self.on_host[t] = True
        elif action == "release":
            if not present[t] or not self.on_host[t]:
                self.say(b, f"release of {t}: needs a swap-out first and a device copy")
            self._drop(t)
        elif action == "swap_in":
            if present[t] or not self.on_host[t]:
                self.say(b, f"swap_in of {t}: must be absent and swapped out")
            present[t], ready[t] = True, False
            self.copies[t] += 1
        elif action == "wait":
            if not present[t]:
                self.say(b, f"wait for {t}: it is not being swapped in")
            ready[t] = present[t]
        elif action == "recompute":
            if present[t]:
                self.say(b, f"recompute of {t}: it is still present")
            missing = [s for s in self.sources[t] if not (present[s] and ready[s])]
            if missing:
                self.say(b, f"recompute of {t}: source(s) {missing} not present")
            self._arrive(t)
        elif action == "free":
            if not present[t]:
                self.say(b, f"free of {t}: it is not present")
            self._drop(t)

    def op(self, b: int) -> None:
        """Op b runs: every map it reads must be present and waited for; its outputs arrive."""
        present, ready = self.present, self.ready
        for t in self.needs[b]:
            if t in present and not (present[t] and ready[t]):
                self.say(b, f"op {b} needs {t}, which is "
                            f"{'not yet waited for' if present[t] else 'absent'}")
        for t in self.produced_by.get(b, ()):
            if present[t] and b > 0:
                self.say(b, f"op {b} produces {t}, which is already present")
            self._arrive(t)

    def _arrive(self, t: int) -> None:
        self.present[t] = self.ready[t] = True
        self.copies[t] += 1

    def _drop(self, t: int) -> None:
        self.present[t] = self.ready[t] = False
        self.drops[t] += 1

    def finish(self) -> list[str]:
        """At the end every map is gone, dropped once per device copy."""
        for t in self.present:
            if self.present[t]:
                self.problems.append(f"tensor {t} is never freed")
            elif self.drops[t] != self.copies[t]:
                self.problems.append(f"tensor {t}: {self.copies[t]} device copies but "
                                     f"{self.drops[t]} drops")
        return self.problems


def schedule_memory(profile: Profile, schedule: pd.DataFrame,
                    configs: dict[int, int] | None = None) -> pd.DataFrame:
    """Device bytes at each boundary (``bytes``: after its actions; ``bytes_before``: before
    them) and the peak while op b runs.

    Every non-feature-map event stays where the profile has it; feature maps are allocated
    by their producer and by swap_in / recompute, dropped by release / free. ``configs``:
    op -> pieces the plan runs ops in (``Plan.configs``); ops left out run whole.
    """
    model = compile_profile(profile)
    _, peak_inc = applied(model.configs, model.configs.index_of(configs or {}), model.dur,
                          model.peak_inc)
    n = model.n
    change = np.zeros(n + 1, np.int64)
    extra = np.zeros(n + 1, np.int64)
    for b, action, t in zip(schedule["boundary"], schedule["action"], schedule["tensor"]):
        i = model.index[int(t)]
        if action in ("free", "release"):
            change[b] -= model.nbytes[i]
        elif action in ("swap_in", "recompute"):
            change[b] += model.nbytes[i]
            if action == "recompute":
                extra[b] = max(extra[b], model.rc_extra[i] + model.between[b])
    level = levels_from_changes(model.base_level, change)
    return pd.DataFrame({"boundary": np.arange(n + 1), "bytes": level,
                         "bytes_before": level - change[: n + 1],
                         "peak_bytes": tops(level, peak_inc, extra)})
