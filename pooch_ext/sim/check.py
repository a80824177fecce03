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
    problems: list[str] = []
    fms = profile.feature_maps.set_index("tensor")
    n = profile.n_ops
    unknown = set(schedule["action"]) - set(ACTIONS)
    if unknown:
        return [f"unknown action(s) {sorted(unknown)}"]
    strangers = set(int(t) for t in schedule["tensor"]) - set(fms.index)
    if strangers:
        return [f"tensor(s) {sorted(strangers)[:5]} are not feature maps"]
    if len(schedule) and (schedule["boundary"].min() < 0 or schedule["boundary"].max() > n):
        return [f"boundaries must lie in 0..{n}"]
    if plan is not None:
        for t, action in zip(schedule["tensor"], schedule["action"]):
            cls = plan.classes.get(int(t), "keep")
            if action not in _ALLOWED[cls]:
                problems.append(f"tensor {t} is {cls} but the schedule has '{action}' for it")
                break

    present = {int(t): False for t in fms.index}
    ready = dict(present)
    on_host = dict(present)
    drops = {t: 0 for t in present}
    copies = {t: 0 for t in present}
    produced_by: dict[int, list[int]] = {}
    for t, p in zip(fms.index, fms["producer"]):
        produced_by.setdefault(int(p), []).append(int(t))
    sources = {int(t): [int(s) for s in srcs if s in present]
               for t, srcs in zip(fms.index, fms["recompute_sources"])}
    by_boundary = {b: g.sort_values("order") for b, g in schedule.groupby("boundary")}
    needs = list(profile.ops["needs"])

    def say(b: int, text: str) -> None:
        if len(problems) < 20:
            problems.append(f"boundary {b}: {text}")

    for b in range(n + 1):
        group = by_boundary.get(b)
        if group is not None:
            for action, t in zip(group["action"], group["tensor"]):
                t = int(t)
                if action == "swap_out":
                    if not (present[t] and ready[t]) or on_host[t]:
                        say(b, f"swap_out of {t}: must be present, ready and not yet on the host")
                    on_host[t] = True
                elif action == "release":
                    if not present[t] or not on_host[t]:
                        say(b, f"release of {t}: needs a swap-out first and a device copy")
                    present[t] = ready[t] = False
                    drops[t] += 1
                elif action == "swap_in":
                    if present[t] or not on_host[t]:
                        say(b, f"swap_in of {t}: must be absent and swapped out")
                    present[t], ready[t] = True, False
                    copies[t] += 1
                elif action == "wait":
                    if not present[t]:
                        say(b, f"wait for {t}: it is not being swapped in")
                    ready[t] = present[t]
                elif action == "recompute":
                    if present[t]:
                        say(b, f"recompute of {t}: it is still present")
                    missing = [s for s in sources[t] if not (present[s] and ready[s])]
                    if missing:
                        say(b, f"recompute of {t}: source(s) {missing} not present")
                    present[t] = ready[t] = True
                    copies[t] += 1
                elif action == "free":
                    if not present[t]:
                        say(b, f"free of {t}: it is not present")
                    present[t] = ready[t] = False
                    drops[t] += 1
        if b < n:
            for t in needs[b]:
                if t in present and not (present[t] and ready[t]):
                    say(b, f"op {b} needs {t}, which is "
                           f"{'not yet waited for' if present[t] else 'absent'}")
            for t in produced_by.get(b, ()):
                if present[t] and b > 0:
                    say(b, f"op {b} produces {t}, which is already present")
                present[t] = ready[t] = True
                copies[t] += 1
    for t in present:
        if present[t]:
            problems.append(f"tensor {t} is never freed")
        elif drops[t] != copies[t]:
            problems.append(f"tensor {t}: {copies[t]} device copies but {drops[t]} drops")
    return problems


def schedule_memory(profile: Profile, schedule: pd.DataFrame) -> pd.DataFrame:
    """Device bytes at each boundary (after its actions) and the peak while op b runs.

    Every non-feature-map event stays where the profile has it; feature maps are allocated
    by their producer and by swap_in / recompute, dropped by release / free.
    """
    model = compile_profile(profile)
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
                extra[b] = max(extra[b], model.rc_extra[i])
    level = levels_from_changes(model.base_level, change)
    return pd.DataFrame({"boundary": np.arange(n + 1), "bytes": level,
                         "peak_bytes": tops(level, model.peak_inc, extra)})
