"""The Profile contract's checks: each cell, then how the three tables fit together.

Every plan is computed from a profile, so a value that cannot be right (a NaN, infinite or
negative time; a size that is not shape x dtype; an op that reads a tensor before it exists;
frees of memory never allocated) is refused where a profile is made or loaded, naming the
table (or file), row and column, instead of becoming a different plan or a simulation that
never ends. The checks run on parsed tables (profile.py's column types).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pooch_ext.errors import ProfileError
from pooch_ext.units import MAX_BYTES, MAX_SECONDS

MAX_TOTAL = 1 << 62      # all allocations together: int64 sums stay exact
# the contract's vocabularies (profile.py re-exports them)
PHASES = ("forward", "backward", "update")
TENSOR_KINDS = ("input", "feature_map", "intermediate", "held")
MEMORY_KINDS = ("malloc", "free")
MEMORY_CATEGORIES = ("activation", "gradient", "transient", "other")


@dataclass(frozen=True)
class Problem:
    """One defect: where it is (table, row position or None for the whole column) and what."""

    table: str
    row: int | None
    column: str
    message: str

    def where(self, folder: str | Path | None = None) -> str:
        """'<folder>/tensors.csv, row 4, column 'bytes': ...' (rows counted from 1 after the
        header), or without a folder "tensors table, row 3, column 'bytes': ..." (positions)."""
        if folder is None:
            place = f"{self.table} table" + ("" if self.row is None else f", row {self.row}")
        else:
            place = (f"{Path(folder) / (self.table + '.csv')}"
                     + ("" if self.row is None else f", row {self.row + 1}"))
        return f"{place}, column '{self.column}': {self.message}"


class ProfileProblems(ProfileError):
    """A profile's defects; the message is the first of them (and how many more)."""

    def __init__(self, problems: list[Problem], folder: str | Path | None = None) -> None:
        self.problems, self.folder = list(problems), folder
        more = len(self.problems) - 1
        super().__init__(self.problems[0].where(folder)
                         + (f" (and {more} more problem{'s' * (more > 1)})" if more else ""))


def check_tables(ops: pd.DataFrame, tensors: pd.DataFrame, memory: pd.DataFrame) -> list[Problem]:
    """Every problem of three parsed tables; cross-table checks only once the cells are sound."""
    problems = _cells(ops, tensors, memory)
    if not problems:
        problems = _ops_refs(ops, tensors) + _tensor_refs(ops, tensors) + _memory_refs(tensors, memory)
    return problems


# ---------------------------------------------------------------- cells

class _Problems(list):
    """Problems with one entry per column and check: the first bad row, and how many more."""

    def flag(self, table: str, column: str, values: Any, bad: np.ndarray, what: str) -> None:
        rows = np.flatnonzero(bad)
        if len(rows):
            row = int(rows[0])
            more = f" (and {len(rows) - 1} more row{'s' * (len(rows) > 2)})" if len(rows) > 1 else ""
            self.append(Problem(table, row, column, f"{_show(values[row])} {what}{more}"))


def _show(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + " ".join(str(v) for v in value) + "]"
    return repr(value.item() if isinstance(value, np.generic) else value)


def _cells(ops: pd.DataFrame, tensors: pd.DataFrame, memory: pd.DataFrame) -> list[Problem]:
    p = _Problems()
    _value_cells(p, ops, tensors, memory)
    phase = _op_cells(p, ops)
    _tensor_cells(p, tensors, phase, len(ops))
    _memory_cells(p, memory, tensors["tensor"].to_numpy(np.int64), len(ops))
    return p


def _value_cells(p: _Problems, ops: pd.DataFrame, tensors: pd.DataFrame,
                 memory: pd.DataFrame) -> None:
    """Times lie in 0..MAX_SECONDS; byte counts in 0..MAX_BYTES; there are ops."""
    if not len(ops):
        p.append(Problem("ops", None, "op", "the profile has no ops (an empty network)"))
    for table, frame, columns in (("ops", ops, ("duration_s", "runtime_s", "rerun_s")),
                                  ("tensors", tensors, ("swap_out_s", "swap_in_s", "recompute_s"))):
        for column in columns:
            v = frame[column].to_numpy(float)
            p.flag(table, column, v, ~(v >= 0) | ~(v <= MAX_SECONDS),
                   f"is not a time in 0..{MAX_SECONDS:g} s")
    for table, frame, column in (("ops", ops, "transient_bytes"), ("tensors", tensors, "bytes"),
                                 ("memory", memory, "bytes")):
        v = frame[column].to_numpy(np.int64)
        p.flag(table, column, v, (v < 0) | (v > MAX_BYTES), f"is not a byte count in 0..{MAX_BYTES}")


def _op_cells(p: _Problems, ops: pd.DataFrame) -> np.ndarray:
    """Ops numbered in row order, phases in order, each backward op naming its own forward
    op; returns the phases."""
    n = len(ops)
    op, phase = ops["op"].to_numpy(np.int64), ops["phase"].to_numpy(object)
    p.flag("ops", "op", op, op != np.arange(n), "is out of order (ops are numbered 0, 1, 2, ... "
           "in row order)")
    p.flag("ops", "phase", phase, ~np.isin(phase, PHASES), f"is not one of {', '.join(PHASES)}")
    rank = np.array([PHASES.index(x) if x in PHASES else 0 for x in phase], np.int64)
    p.flag("ops", "phase", phase, np.r_[False, np.diff(rank) < 0] if n else rank < 0,
           "comes after a later phase (forward ops, then backward, then update)")
    fwd_op = ops["fwd_op"].to_numpy(np.int64)
    backward = phase == "backward"
    target_ok = (fwd_op >= 0) & (fwd_op < n)
    target_ok[target_ok] = phase[fwd_op[target_ok]] == "forward"
    p.flag("ops", "fwd_op", fwd_op, backward & ~target_ok, "is not a forward op (a backward op "
           "names the forward op it differentiates)")
    p.flag("ops", "fwd_op", fwd_op, ~backward & (fwd_op != -1), "must be -1 for a "
           "forward or update op")
    bad_configs = np.array([not _configs_sound(c) for c in ops["configs"]], bool)
    p.flag("ops", "configs", ops["configs"].to_numpy(object), bad_configs,
           "are not split configurations (distinct pieces >= 2, bytes in "
           f"0..{MAX_BYTES}, seconds in 0..{MAX_SECONDS:g})")
    seen_fwd = pd.Series(fwd_op[backward]).duplicated().to_numpy()
    repeated = np.zeros(n, bool)
    repeated[np.flatnonzero(backward)[seen_fwd]] = True
    p.flag("ops", "fwd_op", fwd_op, repeated, "is differentiated by an earlier backward op too")
    return phase


def _configs_sound(configs: list) -> bool:
    pieces = [c[0] for c in configs]
    return len(set(pieces)) == len(pieces) and all(
        p >= 2 and 0 <= b <= MAX_BYTES and 0 <= t <= MAX_SECONDS for p, b, t in configs)


def _tensor_cells(p: _Problems, tensors: pd.DataFrame, phase: np.ndarray, n: int) -> None:
    """Ids, producers, kinds consistent with producers and backward consumers, classes
    allowed, bytes = shape x dtype size."""
    tid = tensors["tensor"].to_numpy(np.int64)
    p.flag("tensors", "tensor", tid, tid < 0, "is not an id >= 0")
    p.flag("tensors", "tensor", tid, tensors["tensor"].duplicated().to_numpy(), "is a duplicate id")
    producer = tensors["producer"].to_numpy(np.int64)
    made_by_forward = (producer >= 0) & (producer < n)
    made_by_forward[made_by_forward] = phase[producer[made_by_forward]] == "forward"
    p.flag("tensors", "producer", producer, (producer != -1) & ~made_by_forward,
           "is not a forward op (or -1 for a network input)")
    held = tensors["held_until"].to_numpy(np.int64)
    p.flag("tensors", "held_until", held, (held < -1) | (held >= n), f"is not an op (0..{n - 1}) "
           "or -1")
    index = tensors["output_index"].to_numpy(np.int64)
    p.flag("tensors", "output_index", index, index < 0, "is negative")
    kind = tensors["kind"].to_numpy(object)
    p.flag("tensors", "kind", kind, ~np.isin(kind, TENSOR_KINDS),
           f"is not one of {', '.join(TENSOR_KINDS)}")
    p.flag("tensors", "kind", kind, (kind == "input") != (producer == -1),
           "does not match 'producer' (exactly the network inputs have producer -1)")
    needed = tensors["bwd_consumers"].map(len).to_numpy() > 0
    kept_for_backward = ~np.isin(kind, ("input", "intermediate"))
    p.flag("tensors", "kind", kind, np.isin(kind, TENSOR_KINDS) & (producer != -1)
           & (kept_for_backward != needed), "does not match 'bwd_consumers' (a backward op "
           "needs exactly the tensors that are not inputs or intermediates)")
    allowed = tensors[["can_keep", "can_swap", "can_recompute"]].to_numpy(bool).any(axis=1)
    p.flag("tensors", "can_keep", kind, (kind == "feature_map") & ~allowed,
           "feature map may be neither kept, swapped nor recomputed")
    shapes, dtypes, nbytes = tensors["shape"].tolist(), tensors["dtype"].tolist(), tensors["bytes"].tolist()
    itemsize = [_itemsize(d) for d in dtypes]
    p.flag("tensors", "dtype", dtypes, np.array([s is None for s in itemsize], bool),
           "is not a NumPy dtype")
    p.flag("tensors", "shape", shapes,
           np.array([any(d < 0 or d > MAX_BYTES for d in s) for s in shapes], bool),
           f"has a dimension outside 0..{MAX_BYTES}")
    expected = [None if size is None or any(d < 0 for d in s) else math.prod(s) * size
                for s, size in zip(shapes, itemsize)]
    p.flag("tensors", "bytes", nbytes,
           np.array([e is not None and e != b for e, b in zip(expected, nbytes)], bool),
           "is not shape x dtype size")


def _memory_cells(p: _Problems, memory: pd.DataFrame, tid: np.ndarray, n: int) -> None:
    """Events in program order, known kinds and categories, known tensors, a bounded total."""
    seq, mop = memory["seq"].to_numpy(np.int64), memory["op"].to_numpy(np.int64)
    p.flag("memory", "seq", seq, np.r_[False, np.diff(seq) <= 0], "does not increase")
    p.flag("memory", "op", mop, (mop < 0) | (mop >= n), f"is not an op (0..{n - 1})")
    p.flag("memory", "op", mop, np.r_[False, np.diff(mop) < 0], "goes back (events are in "
           "program order)")
    mkind, category = memory["kind"].to_numpy(object), memory["category"].to_numpy(object)
    p.flag("memory", "kind", mkind, ~np.isin(mkind, MEMORY_KINDS), f"is not one of {', '.join(MEMORY_KINDS)}")
    p.flag("memory", "category", category, ~np.isin(category, MEMORY_CATEGORIES),
           f"is not one of {', '.join(MEMORY_CATEGORIES)}")
    mtensor = memory["tensor"].to_numpy(np.int64)
    p.flag("memory", "tensor", mtensor, (mtensor != -1) & ~np.isin(mtensor, tid),
           "is not a tensor of tensors.csv (or -1)")
    mbytes = memory["bytes"].to_numpy(np.int64)
    total = np.cumsum(np.where(mkind == "malloc", np.minimum(mbytes, MAX_BYTES), 0))
    p.flag("memory", "bytes", mbytes, total > MAX_TOTAL, f"brings the allocations past {MAX_TOTAL} bytes")


def _itemsize(dtype: str) -> int | None:
    """Bytes per element of ``dtype``; 0 for "" (an output nobody kept); None if not a dtype."""
    if dtype == "":
        return 0
    try:
        return np.dtype(dtype).itemsize
    except (TypeError, ValueError):
        return None


# ---------------------------------------------------------------- references between tables

def _ops_refs(ops: pd.DataFrame, tensors: pd.DataFrame) -> list[Problem]:
    """What each op reads, makes and needs exists when it runs."""
    p: list[Problem] = []
    producer = dict(zip(tensors["tensor"].tolist(), tensors["producer"].tolist()))
    last_forward = int((ops["phase"] == "forward").sum()) - 1
    for k, (phase, inputs, outputs, needs) in enumerate(zip(
            ops["phase"], ops["inputs"], ops["outputs"], ops["needs"])):
        for column, ids in (("inputs", inputs), ("outputs", outputs), ("needs", needs)):
            unknown = [t for t in ids if t not in producer]
            if unknown:
                p.append(Problem("ops", k, column, f"tensor {unknown[0]} is not in tensors.csv"))
                continue
            if phase != "forward" and column != "needs" and ids:
                p.append(Problem("ops", k, column, f"a {phase} op lists tensors here"))
            elif column == "outputs":
                other = [t for t in ids if producer[t] != k]
                if other:
                    p.append(Problem("ops", k, column, f"tensor {other[0]} is made by op "
                                                       f"{producer[other[0]]}"))
            else:
                # a backward op may need anything forward made (an encoded form is made
                # by a map's last forward reader, after the op whose backward needs it)
                last = k - 1 if phase == "forward" else last_forward if phase == "backward" \
                    else -1
                early = [t for t in ids if producer[t] > last]
                if early:
                    p.append(Problem("ops", k, column, f"reads tensor {early[0]} before op "
                                                       f"{producer[early[0]]} makes it"))
                elif column == "needs" and phase == "forward" and set(ids) != set(inputs):
                    p.append(Problem("ops", k, column, "a forward op needs exactly its inputs"))
    return p


def _tensor_refs(ops: pd.DataFrame, tensors: pd.DataFrame) -> list[Problem]:
    """Producers, consumers and recompute chains agree with the ops table."""
    p: list[Problem] = []
    n = len(ops)
    phase, outputs = ops["phase"].tolist(), ops["outputs"].tolist()
    rerun = ops["rerun_s" if "rerun_s" in ops else "duration_s"].tolist()
    inputs = [set(x) for x in ops["inputs"]]
    needs = [set(x) for x in ops["needs"]]
    known = set(tensors["tensor"].tolist())
    readers: dict[int, list[int]] = {}
    for k, ids in enumerate(inputs):
        for x in ids:
            readers.setdefault(x, []).append(k)
    for row, (t, made_by, kind, fwd, bwd, chain, sources, rc_s) in enumerate(zip(
            tensors["tensor"], tensors["producer"], tensors["kind"], tensors["fwd_consumers"],
            tensors["bwd_consumers"], tensors["recompute_ops"], tensors["recompute_sources"],
            tensors["recompute_s"])):
        if made_by >= 0 and t not in outputs[made_by]:
            p.append(Problem("tensors", row, "producer", f"op {made_by} does not list tensor {t} "
                                                         "among its outputs"))
        wrong = [k for k in fwd if not (made_by < k < n and phase[k] == "forward" and t in inputs[k])]
        missed = [k for k in readers.get(t, ()) if k not in fwd]
        if wrong or missed:
            p.append(Problem("tensors", row, "fwd_consumers",
                             f"op {wrong[0]} is not a later forward op reading tensor {t}" if wrong
                             else f"leaves out op {missed[0]}, which reads tensor {t}"))
        wrong = [k for k in bwd if not (0 <= k < n and phase[k] == "backward" and t in needs[k])]
        if wrong:
            p.append(Problem("tensors", row, "bwd_consumers", f"op {wrong[0]} is not a backward "
                                                              f"op that needs tensor {t}"))
        p.extend(_chain_problems(row, t, made_by, kind, chain, sources, rc_s, phase, outputs,
                                 inputs, rerun, known))
    listed = {(k, t) for row_bwd, t in zip(tensors["bwd_consumers"], tensors["tensor"]) for k in row_bwd}
    for k in range(n):
        if phase[k] == "backward":
            missing = [t for t in sorted(needs[k]) if (k, t) not in listed]
            if missing:
                p.append(Problem("ops", k, "needs", f"tensor {missing[0]} does not list op {k} "
                                                    "in its bwd_consumers"))
    return p


def _chain_problems(row: int, t: int, made_by: int, kind: str, chain: list[int],
                    sources: list[int], rc_s: float, phase: list[str], outputs: list[list[int]],
                    inputs: list[set[int]], rerun: list[float], known: set[int]) -> list[Problem]:
    """A feature map's recompute chain: sorted forward ops ending with its producer, reading
    only what the chain makes or its sources, costing its ops' rerun time."""
    if bool(chain) != (kind == "feature_map"):
        return [Problem("tensors", row, "recompute_ops", "must list the chain that rebuilds a "
                                                         "feature map, and only for one")]
    if chain and (list(chain) != sorted(set(chain)) or chain[-1] != made_by
                  or any(not (0 <= k < len(phase) and phase[k] == "forward") for k in chain)):
        return [Problem("tensors", row, "recompute_ops", f"is not a sorted list of forward ops "
                                                         f"ending with the producer {made_by}")]
    if any(s not in known for s in sources):
        return [Problem("tensors", row, "recompute_sources", "names a tensor not in tensors.csv")]
    made = {x for k in chain for x in outputs[k]}
    read = set().union(*(inputs[k] for k in chain)) if chain else set()
    if read - made - set(sources) or set(sources) - read:
        return [Problem("tensors", row, "recompute_sources", "are not the tensors the chain "
                                                             "reads and does not make itself")]
    if not math.isclose(rc_s, sum(rerun[k] for k in chain), rel_tol=1e-9, abs_tol=1e-12):
        return [Problem("tensors", row, "recompute_s", f"{rc_s!r} is not the rerun time (ops "
                                                       "rerun_s) of its recompute_ops")]
    return []


def _memory_refs(tensors: pd.DataFrame, memory: pd.DataFrame) -> list[Problem]:
    """Each tensor is allocated once, at or after the op that makes it, freed once after that,
    with its own size; no free takes the device below what was allocated."""
    p: list[Problem] = []
    info = {t: (made_by, nbytes, kind) for t, made_by, nbytes, kind in zip(
        tensors["tensor"], tensors["producer"], tensors["bytes"], tensors["kind"])}
    malloc_at: dict[int, int] = {}
    freed: set[int] = set()
    level = 0
    for row, (op, kind, nbytes, t) in enumerate(zip(memory["op"], memory["kind"], memory["bytes"],
                                                    memory["tensor"])):
        level += nbytes if kind == "malloc" else -nbytes
        if level < 0:
            p.append(Problem("memory", row, "bytes", f"frees {nbytes} bytes where only "
                                                     f"{level + nbytes} are allocated"))
            break
        if t < 0:
            continue
        made_by, size, _ = info[t]
        if nbytes != size:
            p.append(Problem("memory", row, "bytes", f"{nbytes} is not the size of tensor {t} ({size})"))
        elif kind == "malloc" and (t in malloc_at or op < made_by):
            p.append(Problem("memory", row, "op", f"allocates tensor {t} "
                             + ("twice" if t in malloc_at else f"before op {made_by} makes it")))
        elif kind == "malloc":
            malloc_at[t] = row
        elif t not in malloc_at or t in freed:
            p.append(Problem("memory", row, "kind", f"frees tensor {t} "
                             + ("twice" if t in freed else "before it is allocated")))
        else:
            freed.add(t)
    for row, (t, size, kind) in enumerate(zip(tensors["tensor"], tensors["bytes"], tensors["kind"])):
        if kind == "feature_map" and size > 0 and (t not in malloc_at or t not in freed):
            p.append(Problem("tensors", row, "tensor", f"feature map {t} has no "
                             + ("malloc" if t not in malloc_at else "free") + " in memory.csv"))
    return p
