"""Gist's in-place ReLU (issue 16; ../shared/papers/gist.txt, "Opportunities For Inplace
Computation"): a ReLU whose input nothing reads afterwards writes its output over that input,
so the convolution's (or normalization's) output and the ReLU's never exist at once. Part of
Gist's lossless techniques: the values are the same, only the memory differs.

Which ops (``inplace_ops``), checked on the real graph: a forward ReLU whose one input is the
iteration's own (not a network input), read by no other op in forward or backward, not held
by the caller's code past the op (``held_until``), freed right after it, and whose array
nothing else referred to when the graph was traced (``ALONE``: the trace notes it per op,
hooks/inplace_relu.py; a NumPy reference to the input, a view of it, a Variable sharing it).
The executor checks the last again at each such op and runs it out of place (a deviation,
re-profiled) where it fails.

How the planner sees it (``inplace_profile``): the input's free moves from after the op to
before it, so the op's output takes the input's place; the profile's meta lists the ops
(``INPLACE``) for the executor (hooks/program.py).
"""
from __future__ import annotations

import dataclasses

from pooch_ext.errors import PoochError
from pooch_ext.profile import Profile

FUNCTIONS = ("ReLU",)       # functions whose output may take their input's place
ALONE = "inputs_alone"      # Profile.meta: forward ops whose input array was referred to
                            # by nothing but its Variable when traced
INPLACE = "inplace"         # Profile.meta: forward ops that write over their input


def inplace_ops(profile: Profile) -> list[int]:
    """The forward ops that may write their output over their input (see the docstring)."""
    alone = set(profile.meta.get(ALONE) or ())
    tensors = profile.tensors.set_index("tensor")
    free_op = _free_ops(profile)
    chosen = []
    for op in profile.ops[profile.ops["phase"] == "forward"].itertuples():
        if op.name not in FUNCTIONS or op.op not in alone or len(op.inputs) != 1 \
                or len(op.outputs) != 1:
            continue
        x, y = int(op.inputs[0]), int(op.outputs[0])
        row = tensors.loc[x]
        same_array = all(tensors.at[y, c] == row[c] for c in ("bytes", "dtype")) \
            and tuple(tensors.at[y, "shape"]) == tuple(row["shape"])
        if row["kind"] != "intermediate" or row["producer"] < 0 or not same_array \
                or list(row["fwd_consumers"]) != [op.op] or row["held_until"] > op.op \
                or free_op.get(x) != op.op:
            continue
        chosen.append(int(op.op))
    return chosen


def _free_ops(profile: Profile) -> dict[int, int]:
    """Tensor -> the op after which the profile frees it."""
    memory = profile.memory
    frees = memory[(memory["kind"] == "free") & (memory["tensor"] >= 0)]
    return dict(zip(frees["tensor"].astype(int), frees["op"].astype(int)))


def inplace_profile(profile: Profile, ops: list[int] | None = None) -> Profile:
    """``profile`` with ``ops`` (None: every op ``inplace_ops`` allows) writing over their
    input: each input's free moves ahead of its op's own events, and meta[INPLACE] lists the
    ops. The same profile for no ops; an op ``inplace_ops`` does not allow is refused."""
    allowed = inplace_ops(profile)
    ops = allowed if ops is None else ops
    if not ops:
        return profile
    refused = sorted(set(ops) - set(allowed))
    n_fwd = int((profile.ops["phase"] == "forward").sum())
    if refused and not 0 <= refused[0] < n_fwd:
        raise PoochError(f"op {refused[0]} is not a forward op of this profile (ops 0 to "
                         f"{n_fwd - 1}): only a forward ReLU may write over its input")
    if refused:
        raise PoochError(f"op {refused[0]} ({profile.ops.at[refused[0], 'name']}) cannot "
                         "write over its input in this profile (only a ReLU whose input "
                         "nothing else reads or holds): a plan runs on the profile it was "
                         "made from")
    memory = profile.memory.copy()
    inputs = {int(profile.ops.at[k, "inputs"][0]): k for k in ops}
    moved = (memory["kind"] == "free") & memory["tensor"].isin(list(inputs))
    # within an op, events keep their order; a moved free sorts ahead of its op's events
    memory["_key"] = memory["seq"].astype(float)
    first_of_op = memory.groupby("op")["seq"].min()
    memory.loc[moved, "_key"] = [first_of_op[op] - 0.5 for op in memory.loc[moved, "op"]]
    memory = memory.sort_values("_key", kind="stable").drop(columns="_key")
    memory["seq"] = range(len(memory))
    memory = memory.reset_index(drop=True)
    return dataclasses.replace(profile, memory=memory,
                               meta=dict(profile.meta, **{INPLACE: sorted(int(k) for k in ops)}))


def inplace_of(profile: Profile) -> list[int]:
    """The ops an ``inplace_profile`` runs in place; [] for any other profile."""
    return [int(k) for k in profile.meta.get(INPLACE) or ()]

