"""The classification table (plan.TABLE_COLUMNS): one row per feature map, for people and CSV.

It says what each map is, what the policy chose, what each choice costs on the link, the
r(X) = recompute overhead / swap overhead where PoocH computed it, and the compute stall the
map caused in the simulated timeline.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from pooch_ext.plan import TABLE_COLUMNS, Plan
from pooch_ext.profile import Profile
from pooch_ext.profile_format import format_shape
from pooch_ext.sim.model import SimModel


def plan_table(profile: Profile, plan: Plan, stalls: pd.DataFrame, model: SimModel) -> pd.DataFrame:
    """The table of ``plan`` after simulation (``stalls``: the Timeline's, tensor -> stall_s);
    r values already in plan.table are kept."""
    fms = profile.feature_maps.set_index("tensor").loc[model.tensor]
    ops = profile.ops
    producer = fms["producer"].to_numpy()
    r_known = {}
    if len(plan.table) and "r" in plan.table.columns:
        r_known = dict(zip(plan.table["tensor"].astype(int), plan.table["r"]))
    stalls = dict(zip(stalls["tensor"], stalls["stall_s"]))
    table = pd.DataFrame({
        "tensor": model.tensor,
        "producer": producer,
        "function": ops["name"].to_numpy()[producer],
        "label": ops["label"].to_numpy()[producer],
        "shape": [format_shape(shape) for shape in fms["shape"]],
        "bytes": model.nbytes,
        "class": [plan.classes.get(int(t), "keep") for t in model.tensor],
        "swap_out_s": model.so_s,
        "swap_in_s": model.si_s,
        "recompute_s": model.rc_s,
        "r": [float(r_known.get(int(t), np.nan)) for t in model.tensor],
        "stall_s": [float(stalls.get(int(t), 0.0)) for t in model.tensor],
    })
    return table[list(TABLE_COLUMNS)]
