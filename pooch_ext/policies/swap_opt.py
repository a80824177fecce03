"""swap-opt: PoocH's keep / swap step only (paper 4.4.2), swap-ins scheduled early."""
from __future__ import annotations

from pooch_ext.links import Link
from pooch_ext.plan import Plan
from pooch_ext.policies.common import Context
from pooch_ext.policies.search import keep_swap
from pooch_ext.profile import Profile


def classify(profile: Profile, budget: int | str | None = None,
             link: Link | str | None = None, host_budget: int | str | None = None) -> Plan:
    ctx = Context(profile, budget, link, "swap-opt", host_budget)
    codes, _ = keep_swap(ctx.model, ctx.budget, host_budget=ctx.host_budget)
    return ctx.plan(codes, "early")
