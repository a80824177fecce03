"""mu-cuDNN's two ways to fit convolutions into a workspace limit (papers/mu-cudnn.txt), over
our split configurations (issue 14): which configuration each convolution runs in.

* WR (workspace reuse): every layer may use up to ``limit`` bytes of scratch, one layer at a
  time; each takes its fastest configuration within the limit. mu-cuDNN finds it by dynamic
  programming over micro-batch sizes; our configurations are even divisions into ``pieces``,
  so the program reduces to picking the fastest admissible one per layer.
* WD (workspace division): all layers' scratch together within ``limit`` (mu-cuDNN gives each
  layer its own segment of one pool); the fastest total time is an integer program,
  solved with scipy.optimize.milp: one binary per (layer, configuration), one configuration
  per layer, the chosen scratch summed within the limit.

Both return op -> pieces (whole ops included) and raise ValueError when no choice meets the
limit. A configuration's scratch is its ``transient_bytes`` (the profile's ``configs``).
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from pooch_ext.profile import Profile

MODES = ("wr", "wd")


def options(profile: Profile) -> dict[int, list[tuple[int, int, float]]]:
    """op -> its configurations as (pieces, workspace bytes, seconds), whole first. The
    workspace is the kernel's own scratch: a measured profile's transient bytes less what it
    lists as unmodelled there (memory Chainer holds at that op that the graph model lacks,
    e.g. 193 MB at AlexNet b16's first op on the CPU device: not the kernel's)."""
    ops = profile.ops
    unmodelled = {int(k): int(v) for k, v in profile.meta.get("unmodelled_bytes", [])}
    table = {}
    for k, configs in zip(ops["op"], ops["configs"]):
        if len(configs):
            own = unmodelled.get(int(k), 0)
            table[int(k)] = [(1, int(ops.at[k, "transient_bytes"]) - own,
                              float(ops.at[k, "duration_s"]))] + \
                [(int(p), int(b) - own, float(s)) for p, b, s in configs]
    return table


def workspace_reuse(profile: Profile, limit: int) -> dict[int, int]:
    """WR: per op the fastest configuration whose scratch is within ``limit``."""
    chosen = {}
    for op, configs in options(profile).items():
        within = [c for c in configs if c[1] <= limit]
        if not within:
            raise ValueError(f"op {op} needs {min(c[1] for c in configs)} bytes of scratch "
                             f"in every configuration; the limit is {limit}")
        chosen[op] = min(within, key=lambda c: (c[2], c[1]))[0]
    return chosen


def workspace_division(profile: Profile, limit: int) -> dict[int, int]:
    """WD: the configurations of least total time whose scratch sums within ``limit``."""
    table = options(profile)
    rows = [(op, pieces, nbytes, seconds) for op, configs in table.items()
            for pieces, nbytes, seconds in configs]
    if not rows:
        return {}
    ops = list(table)
    one_each = np.array([[1.0 if r[0] == op else 0.0 for r in rows] for op in ops])
    scratch = np.array([[float(r[2]) for r in rows]])
    result = milp(c=np.array([r[3] for r in rows]), integrality=np.ones(len(rows)),
                  bounds=Bounds(0, 1),
                  constraints=[LinearConstraint(one_each, 1, 1),
                               LinearConstraint(scratch, 0, float(limit))])
    if not result.success:
        raise ValueError(f"no configuration of the {len(ops)} convolutions keeps their scratch "
                         f"within {limit} bytes together ({result.message})")
    picked = np.flatnonzero(result.x > 0.5)
    return {rows[i][0]: rows[i][1] for i in picked}


def choose(profile: Profile, limit: int, mode: str) -> dict[int, int]:
    """``workspace_reuse`` ("wr") or ``workspace_division`` ("wd") under ``limit`` bytes."""
    if mode not in MODES:
        raise ValueError(f"unknown mu-cuDNN mode {mode!r}; known: {', '.join(MODES)}")
    return (workspace_reuse if mode == "wr" else workspace_division)(profile, limit)


def conv_seconds(profile: Profile, chosen: dict[int, int]) -> float:
    """Seconds the convolutions with configurations take in the chosen ones."""
    table = options(profile)
    return sum(next(c[2] for c in table[op] if c[0] == chosen.get(op, 1)) for op in table)
