"""in-core: every feature map stays on the device (plain training; fails over budget)."""
from __future__ import annotations

import numpy as np

from pooch_ext.links import Link
from pooch_ext.plan import Plan
from pooch_ext.policies.common import Context
from pooch_ext.profile import Profile
from pooch_ext.sim.model import KEEP
from pooch_ext.units import format_bytes


def classify(profile: Profile, budget: int | str | None = None,
             link: Link | str | None = None, host_budget: int | str | None = None) -> Plan:
    ctx = Context(profile, budget, link, "in-core", host_budget)
    plan = ctx.plan(np.full(ctx.model.m, KEEP))
    if not plan.feasible:
        # (the profile's in-core peak is whole convolutions; the simulation splits them
        # where they have configurations, so its peak can be lower, and its time longer)
        split = " with its convolutions split" if len(ctx.model.configs) else ""
        plan.reason = (f"keeping every feature map needs {format_bytes(plan.peak_bytes)} "
                       f"({plan.peak_bytes} bytes){split}, over the budget of "
                       f"{format_bytes(ctx.budget)} ({ctx.budget} bytes)")
    return plan
