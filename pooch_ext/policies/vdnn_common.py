"""vDNN's static policies (papers/vdnn.txt): offload the input feature maps of layers.

vDNN offloads a layer's input during its forward and waits for the copy at the end of the
layer, prefetches one layer ahead in backward within a window that ends at the previous
convolution, and does not look at memory: if the maps it keeps do not fit, the plan is
infeasible. ``which`` picks the layers: all of them, or convolutions only.
"""
from __future__ import annotations

import numpy as np

from pooch_ext.links import Link
from pooch_ext.plan import Plan
from pooch_ext.policies.common import Context
from pooch_ext.profile import Profile
from pooch_ext.sim.model import KEEP, SWAP, is_conv

TIMING = "vdnn"


def classify_vdnn(profile: Profile, budget: int | str | None, link: Link | str | None,
                  name: str, conv_only: bool, host_budget: int | str | None = None) -> Plan:
    """The vDNN plan called ``name``: offload the inputs of every layer, or of convolutions."""
    ctx = Context(profile, budget, link, name, host_budget)
    plan = ctx.plan(offload_codes(ctx, conv_only), TIMING)
    if plan.peak_bytes > ctx.budget:      # not a host budget's refusal: that says so itself
        plan.reason = f"{name} keeps too much for the budget: {plan.reason}"
    return plan


def offload_codes(ctx: Context, conv_only: bool | None) -> np.ndarray:
    """vDNN's classes: offload the inputs of every layer (``conv_only`` False), of
    convolutions (True) or of none (None: in-core)."""
    model = ctx.model
    codes = np.full(model.m, KEEP)
    if conv_only is None:
        return codes
    consumers = dict(zip(ctx.profile.tensors["tensor"], ctx.profile.tensors["fwd_consumers"]))
    for i, t in enumerate(model.tensor):
        readers = consumers[int(t)]
        offload = any(is_conv(model.names[k]) for k in readers) if conv_only else bool(readers)
        if offload and model.can[i, SWAP]:
            codes[i] = SWAP
    return codes
