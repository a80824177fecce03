"""A Program: a plan's schedule compiled against the graph it was made for, ready for the
executor to replay. It holds the actions per op boundary, each recomputed map's chain, and
what each op must look like (function, tensors, shapes) for the plan to still apply, so a
graph that changed is caught before anything is dropped.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from pooch_ext.encodings import Encoded, encoded_maps
from pooch_ext.errors import ExecutorError
from pooch_ext.inplace import inplace_of
from pooch_ext.profile import Profile
from pooch_ext.sim.check import schedule_memory, validate_schedule
from pooch_ext.trace import GraphTrace

# how an iteration treats its maps (Executor.mode): its program's, hooks/ondemand.py's, none
SCHEDULED, ON_DEMAND, PASSIVE = "scheduled", "on demand", "passive"


@dataclass
class Program:
    """What the executor replays: the graph it was planned for, the actions by boundary."""

    reference: GraphTrace
    actions: dict[int, list[tuple[str, int, bool]]]   # boundary -> (action, tensor, final)
    chains: dict[int, list[int]]                      # tensor -> forward ops that rebuild it
    input_sources: frozenset[int]                     # network inputs some chain reads
    n_ops: int
    label: str = ""
    known_inputs: list[list[int]] = field(default_factory=list)   # per op: tensors it reads
    # that earlier ops made (network inputs are new to every iteration)
    in_shapes: list[list[tuple]] = field(default_factory=list)    # per op: sorted (shape,
    # dtype) of everything it reads, parameters included
    # forward op -> (pieces of its forward, pieces of its backward): the plan's split
    # convolutions (Plan.configs by forward op; hooks/split_conv.py runs them)
    splits: dict[int, tuple[int, int]] = field(default_factory=dict)
    # encoded form -> how its map is encoded (pooch_ext/encodings.py): the schedule acts on
    # the encoded form; the executor encodes and decodes the map itself
    encoded: dict[int, Encoded] = field(default_factory=dict)
    # forward ops that write their output over their input (pooch_ext/inplace.py)
    inplace: frozenset[int] = frozenset()
    twins: dict[int, int] = field(default_factory=dict)   # encoded map -> its encoded form
    # per op: what it holds above the level its boundary's actions leave (the plan's memory;
    # empty: not known), and per map the last forward op that reads it (MapActions.make_room)
    op_peaks: list[int] = field(default_factory=list)
    last_read: dict[int, int] = field(default_factory=dict, init=False)   # (from known_inputs)

    def __post_init__(self) -> None:
        self.twins = {info.tensor: twin for twin, info in self.encoded.items()}
        if not self.known_inputs:
            for op in self.reference.ops:
                tensors = self.reference.tensors
                self.known_inputs.append([t for t in op.inputs if tensors[t].producer >= 0])
                shapes = [(tensors[t].shape, tensors[t].dtype) for t in op.inputs] + \
                    [(shape, dtype) for shape, dtype in op.params]
                self.in_shapes.append(sorted(shapes))
        self.last_read = {t: index for index, reads in enumerate(self.known_inputs)
                          for t in reads}

    def matches(self, index: int, name: str, sources: list, in_data: tuple) -> str:
        """Why forward op ``index`` (``name`` reading ``in_data``, whose tensors of this
        iteration are ``sources``) is not the profiled op there; "" when it is. Checked
        before the op runs, so a mismatch stops the plan before it drops anything."""
        ops = self.reference.ops
        if index >= len(ops):
            return f"forward op {index} ({name}) is beyond the {len(ops)} profiled forward ops"
        if ops[index].name != name:
            return f"forward op {index} is {name}, the profiled graph has {ops[index].name}"
        known = [s for s in sources if s is not None]
        if known != self.known_inputs[index]:
            return (f"forward op {index} ({name}) reads tensors {known}, the profiled graph "
                    f"{self.known_inputs[index]}")
        shapes = sorted((tuple(int(d) for d in a.shape), str(a.dtype)) for a in in_data
                        if a is not None)
        if shapes != self.in_shapes[index]:
            return (f"forward op {index} ({name}) reads shapes {[s for s, _ in shapes]}, the "
                    f"profiled graph {[s for s, _ in self.in_shapes[index]]}")
        return ""

    def resolved_differs(self, trace: GraphTrace, index: int) -> str:
        """Why forward op ``index`` of ``trace``, now resolved, read or kept other tensors or
        made other shapes than the profiled op; "" when it did not."""
        reference = self.reference
        if index >= len(reference.ops):
            return ""
        mine, theirs = trace.ops[index], reference.ops[index]
        if (mine.inputs, mine.outputs, mine.retain_inputs, mine.retain_outputs) != \
                (theirs.inputs, theirs.outputs, theirs.retain_inputs, theirs.retain_outputs):
            return (f"forward op {index} ({mine.name}) reads or keeps different tensors than "
                    "in the profiled graph")
        for t in mine.outputs:
            a, b = trace.tensors[t], reference.tensors[t]
            if (a.shape, a.dtype) != (b.shape, b.dtype):
                return (f"tensor {t} of op {index} ({mine.name}) has shape {a.shape} {a.dtype}, "
                        f"the profiled graph had {b.shape} {b.dtype}")
        return ""

    def backward_differs(self, trace: GraphTrace, index: int, fwd_index: int) -> str:
        """Why backward op ``index`` (of forward op ``fwd_index``) is not the profiled one, or
        the forward before it was not as long; "" when it is."""
        reference = self.reference
        position = index - len(trace.ops)
        if len(trace.ops) != len(reference.ops):
            return f"forward had {len(trace.ops)} ops, the profiled graph {len(reference.ops)}"
        if position >= len(reference.backward_order) or \
                reference.backward_order[position] != fwd_index:
            return f"backward op {index} differentiates forward op {fwd_index}, not the profiled one"
        return ""

    def end_differs(self, trace: GraphTrace) -> str:
        """Why the ended iteration ``trace`` ran another number of backward ops; "" if not."""
        ran, planned = len(trace.backward_order), len(self.reference.backward_order)
        if ran != planned:
            return f"the iteration ran {ran} backward ops, the profiled graph {planned}"
        return ""


def compile_program(trace: GraphTrace, profile: Profile, schedule: pd.DataFrame,
                    label: str = "", configs: dict[int, int] | None = None) -> Program:
    """Check ``schedule`` against ``profile`` and the graph it came from; index it by boundary.
    ``configs``: op -> pieces (Plan.configs), each an op's configuration in the profile."""
    n_fwd = int((profile.ops.phase == "forward").sum())
    n_bwd = int((profile.ops.phase == "backward").sum())
    if n_fwd != len(trace.ops) or n_bwd != len(trace.backward_order):
        raise ExecutorError(f"the profile has {n_fwd} forward / {n_bwd} backward ops, the graph "
                            f"{len(trace.ops)} / {len(trace.backward_order)}")
    problems = validate_schedule(profile, schedule)
    if problems:
        raise ExecutorError(f"schedule{' ' + label if label else ''} is not executable: "
                            f"{problems[0]}"
                            + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    rows = schedule.sort_values(["boundary", "order"], kind="stable")
    rows = list(zip(rows["boundary"].astype(int), rows["action"], rows["tensor"].astype(int)))
    last_return: dict[int, int] = {}
    for position, (_, action, tensor) in enumerate(rows):
        if action in ("swap_in", "recompute"):
            last_return[tensor] = position
    actions: dict[int, list[tuple[str, int, bool]]] = {}
    for position, (boundary, action, tensor) in enumerate(rows):
        final = action == "free" and last_return.get(tensor, -1) < position
        actions.setdefault(boundary, []).append((action, tensor, final))
    encoded = encoded_maps(profile)
    for info in encoded.values():
        # encoded before anything moves the encoded form, decoded after its swap-in landed,
        # the decoded map freed after its last backward reader, as the profile models it
        actions.setdefault(info.encode_after + 1, []).insert(0, ("encode", info.tensor, False))
        actions.setdefault(info.decode_at, []).append(("decode", info.tensor, False))
        actions.setdefault(info.last_use + 1, []).append(("free", info.tensor, True))
    tensors = profile.tensors.set_index("tensor")
    recomputed = {t for _, a, t in rows if a == "recompute"}
    # every map that may be rebuilt has its chain: a later backward pass over the graph,
    # which the profile did not show, finds a kept map freed after its last use (on-demand
    # restore, hooks/ondemand.py); the maps a chain reads are restored the same way
    rebuildable = set(tensors.index[tensors["can_recompute"].astype(bool)].astype(int))
    chains = {t: [int(k) for k in tensors.at[t, "recompute_ops"]]
              for t in recomputed | rebuildable}
    kinds = tensors["kind"]
    sources = {int(s) for t in recomputed for s in tensors.at[t, "recompute_sources"]
               if kinds.get(int(s)) == "input"}
    memory = schedule_memory(profile, schedule, configs)
    return Program(trace, actions, chains, frozenset(sources), profile.n_ops, label,
                   splits=_splits(profile, configs or {}),
                   encoded={info.twin: info for info in encoded.values()},
                   inplace=frozenset(inplace_of(profile)),
                   op_peaks=(memory.peak_bytes - memory.bytes).astype(int).tolist())


def _splits(profile: Profile, configs: dict[int, int]) -> dict[int, tuple[int, int]]:
    """Plan configurations by forward op: (forward pieces, backward pieces)."""
    ops = profile.ops
    splits: dict[int, tuple[int, int]] = {}
    for op, pieces in configs.items():
        if not 0 <= op < len(ops) or (pieces != 1 and pieces not in
                                      [c[0] for c in ops.at[op, "configs"]]):
            raise ExecutorError(f"the plan runs op {op} in {pieces} pieces, which the "
                                "profile does not offer")
        backward = ops.at[op, "phase"] == "backward"
        fwd = int(ops.at[op, "fwd_op"]) if backward else op
        forward_pieces, backward_pieces = splits.get(fwd, (1, 1))
        splits[fwd] = (forward_pieces, pieces) if backward else (pieces, backward_pieces)
    return {k: v for k, v in splits.items() if v != (1, 1)}
