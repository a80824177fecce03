"""in-core: every feature map stays on the device (plain training; fails over budget)."""
from __future__ import annotations

import numpy as np

from pooch_ext.links import Link
from pooch_ext.plan import Plan
from pooch_ext.policies.common import Context
from pooch_ext.profile import Profile
from pooch_ext.sim.model import KEEP


def classify(profile: Profile, budget: int | str | None = None,
             link: Link | str | None = None, host_budget: int | str | None = None) -> Plan:
    ctx = Context(profile, budget, link, "in-core", host_budget)
    plan = ctx.plan(np.full(ctx.model.m, KEEP))
    if not plan.feasible:
        plan.reason = (f"in-core needs {plan.peak_bytes} bytes, the budget is {ctx.budget}")
    return plan
