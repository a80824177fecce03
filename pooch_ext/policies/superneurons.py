"""superneurons: the static hybrid PoocH compares with (paper 5.2).

Feature maps are kept from the output side while they fit; of the rest, outputs of
convolutions are swapped and all others recomputed; each swap-in starts with the backward of
the preceding convolution. SuperNeurons recomputes segments that start at convolution
outputs; our recompute holds every map it rebuilds until its last use, so a map whose rebuild
would need another recomputed map (a residual block's output, through its identity shortcut)
is swapped instead of rebuilding the whole chain at once; so is any map with no exact
recompute rule. SuperNeurons itself places those swap-ins without looking at memory (the
paper's batch-640 failure); our simulator delays a swap-in that has no room instead, and the
plan's reason counts how many it delayed.
"""
from __future__ import annotations

import numpy as np

from pooch_ext.links import Link
from pooch_ext.plan import Plan
from pooch_ext.policies.common import Context
from pooch_ext.profile import Profile
from pooch_ext.sim.model import KEEP, RECOMPUTE, SWAP, is_conv
from pooch_ext.sim.budgets import fits

TIMING = "previous-conv"


def classify(profile: Profile, budget: int | str | None = None,
             link: Link | str | None = None, host_budget: int | str | None = None) -> Plan:
    ctx = Context(profile, budget, link, "superneurons", host_budget)
    model = ctx.model
    codes = np.full(model.m, SWAP)
    for i, p in enumerate(model.producer):      # ascending ids: sources are decided first
        if (not is_conv(model.names[p]) and model.can[i, RECOMPUTE]
                and all(codes[s] != RECOMPUTE for s in model.src_fm[i])):
            codes[i] = RECOMPUTE
    codes = np.where(model.can[np.arange(model.m), codes], codes, KEEP)
    for i in np.argsort(-model.tensor):           # keep from the output side while it fits
        trial = codes.copy()
        trial[i] = KEEP
        if not fits(model, trial, ctx.budget):
            break
        codes = trial
    plan = ctx.plan(codes, TIMING)
    delayed = plan.timeline.delayed_swap_ins if plan.timeline is not None else 0
    if plan.feasible and delayed:
        plan.reason = (f"{delayed} swap-in(s) delayed for lack of memory "
                       "(SuperNeurons itself would run out of memory there)")
    return plan
