"""swap-opt: PoocH's keep / swap step only (paper 4.4.2), swap-ins scheduled early."""
from __future__ import annotations

from pooch_ext.plan import Plan
from pooch_ext.policies.common import Context
from pooch_ext.policies.search import keep_swap


def classify(profile, budget=None, link=None) -> Plan:
    ctx = Context(profile, budget, link, "swap-opt")
    codes, _ = keep_swap(ctx.model, ctx.budget)
    return ctx.plan(codes, "early")
