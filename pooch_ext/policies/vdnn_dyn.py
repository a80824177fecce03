"""vdnn-dyn: vDNN's dynamic policy (papers/vdnn.txt, sec. III-C), with split convolutions as
its per-layer algorithm choice (issue 14).

vDNN_dyn first tries in-core training with every convolution's fastest algorithm; if that
does not fit, vDNN_conv, then vDNN_all, still with the fastest algorithms; if even that does
not fit, it goes back to vDNN_conv and then vDNN_all and downgrades the convolutions' algorithms
one layer at a time to their memory-optimal ones until the plan fits. Here a convolution's
algorithms are its split configurations (fastest first; memory-optimal: the smallest peak),
and "fits" is the simulator's verdict under the budget. The downgrade follows forward order,
as vDNN profiles layers front to back.
"""
from __future__ import annotations

import numpy as np

from pooch_ext.links import Link
from pooch_ext.plan import Plan
from pooch_ext.policies.common import Context
from pooch_ext.policies.vdnn_common import TIMING, offload_codes
from pooch_ext.profile import Profile

NAME = "vdnn-dyn"


def classify(profile: Profile, budget: int | str | None = None, link: Link | str | None = None,
             host_budget: int | str | None = None) -> Plan:
    ctx = Context(profile, budget, link, NAME, host_budget)
    configs = ctx.model.configs
    fastest = {int(k): int(p[0]) for k, p in zip(configs.ops, configs.pieces)}
    smallest = {int(k): int(p[np.argmin(peak)])
                for k, p, peak in zip(configs.ops, configs.pieces, configs.peak)}
    plan = None
    for conv_only in (None, True, False):
        plan = ctx.plan(offload_codes(ctx, conv_only), TIMING, configs=fastest)
        if plan.feasible:
            return plan
    for conv_only in (True, False):
        codes, chosen = offload_codes(ctx, conv_only), dict(fastest)
        for op in sorted(smallest):          # one layer at a time, front to back
            if chosen[op] == smallest[op]:
                continue
            chosen[op] = smallest[op]
            plan = ctx.plan(codes, TIMING, configs=chosen)
            if plan.feasible:
                return plan
    assert plan is not None
    plan.reason = f"{NAME}: vDNN_all with every convolution memory-optimal does not fit: " \
                  f"{plan.reason}"
    return plan
