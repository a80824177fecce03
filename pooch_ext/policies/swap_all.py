"""swap-all: every feature map is swapped, swap-ins scheduled early (paper 4.3)."""
from __future__ import annotations

from pooch_ext.links import Link
from pooch_ext.plan import Plan
from pooch_ext.policies.common import Context
from pooch_ext.profile import Profile
from pooch_ext.sim.budgets import tightest_codes

TIMING = "early"


def classify(profile: Profile, budget: int | str | None = None,
             link: Link | str | None = None, host_budget: int | str | None = None) -> Plan:
    ctx = Context(profile, budget, link, "swap-all", host_budget)
    return ctx.plan(tightest_codes(ctx.model), TIMING)
