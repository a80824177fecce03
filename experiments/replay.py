"""Time a finished schedule on another link, keeping every action at its op boundary.

The paper ran the plan PoocH made on POWER9 (NVLink) on the x86 box (PCIe) and it failed at
batch 640: Chainer's malloc / free order followed the timing, so slower copies moved frees
later. Our executor replays a schedule whose actions are anchored to op boundaries, so its
memory at every boundary is the same whatever the link (``schedule_memory`` reads only the
schedule); only time changes. ``replay_time`` predicts that time the way the executor runs
it: swap-outs and swap-ins queue on their copy engines, ``release`` and ``wait`` block compute
until the copy they name has finished, ``recompute`` runs its chain on the compute engine.
Replaying a schedule on the link it was made for gives the simulator's own time (the tests
check this), so the difference on another link is the cost of the mismatch alone.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from pooch_ext.links import Link
from pooch_ext.profile import Profile
from pooch_ext.sim.check import schedule_memory, validate_schedule
from pooch_ext.sim.configs import applied
from pooch_ext.sim.model import compile_profile


def replay_time(profile: Profile, schedule: pd.DataFrame, link: Link | str,
                configs: dict[int, int] | None = None) -> float:
    """Iteration seconds of ``schedule`` (a Plan's, from the simulator) on ``link``, each op
    in the configuration ``configs`` gives it (``Plan.configs``; left out: whole)."""
    problems = validate_schedule(profile, schedule)
    if problems:
        raise ValueError(f"not a sound schedule: {problems[0]}")
    model = compile_profile(profile, link)
    dur, _ = applied(model.configs, model.configs.index_of(configs or {}), model.dur,
                     model.peak_inc)
    by_boundary = {int(b): list(zip(g["action"], g["tensor"]))
                   for b, g in schedule.sort_values(["boundary", "order"]).groupby("boundary")}
    so_done = np.zeros(model.m)
    si_done = np.zeros(model.m)
    t = d2h_free = h2d_free = 0.0
    for b in range(model.n + 1):
        for action, tensor in by_boundary.get(b, ()):
            i = model.index[int(tensor)]
            if action == "swap_out":
                d2h_free = so_done[i] = max(t, d2h_free) + model.so_s[i]
            elif action == "release":
                t = max(t, so_done[i])
            elif action == "swap_in":
                h2d_free = si_done[i] = max(t, h2d_free, so_done[i]) + model.si_s[i]
            elif action == "wait":
                t = max(t, si_done[i])
            elif action == "recompute":
                t += model.rc_s[i]
        if b < model.n:
            t += dur[b]
    return float(t)


def replay_peak_bytes(profile: Profile, schedule: pd.DataFrame,
                      configs: dict[int, int] | None = None) -> int:
    """Peak device bytes of the schedule: the same on every link."""
    return int(schedule_memory(profile, schedule, configs)["peak_bytes"].max())
