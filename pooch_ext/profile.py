"""Profile: one training iteration as the planner sees it (DESIGN.md, "The contracts").

A Profile is plain data: three DataFrames plus a few scalars. It comes either from the cost
model (analytic, no GPU needed) or from a real run (measured by hooks/profiler.py). Everything
downstream (simulator, policies, executor) reads only what is described here.

ops (one row per op, in execution order; ``op`` equals the row position)
    op            int   index in execution order (forward ops, then backward ops, then update)
    phase         str   "forward" | "backward" | "update"
    name          str   Chainer function label, e.g. "Convolution2DFunction"
    label         str   where it came from (link path) when known, else ""
    fwd_op        int   for a backward op: the forward op it differentiates; else -1
    duration_s    float compute time of the op
    inputs        list  activation tensors the op reads (forward ops; [] for backward)
    outputs       list  activation tensors the op creates (forward ops; [] for backward)
    needs         list  tensors that must be on the device while the op runs: a forward
                        op's inputs; for a backward op, the tensors its forward op retained
    transient_bytes int scratch memory allocated and freed inside the op (im2col buffer, ...);
                        in measured profiles also the bytes the graph model misses there
    runtime_s     float host seconds around the op beyond its compute (Python between
                        functions, PoocH's hooks), measured on the CPU device; 0 in analytic
                        and GPU profiles (optional column)
    rerun_s       float seconds to run a forward op again when a recomputation rebuilds a map
                        (measured: BatchNormalization reapplies its stored statistics in about
                        a third of its forward time); duration_s where not measured (optional)
    configs       list  other ways the op can run (split convolutions, issue 14): entries
                        (pieces, transient_bytes, duration_s) besides the row itself, which is
                        the op whole; [] when none (optional). Written "2:1048576:0.0012 ...".
                        Analytic: analytic/splits.py; measured: hooks/conv_configs.py

tensors (activations only; parameters are resident and not listed)
    tensor        int   id: creation order in the iteration, stable for a static graph
    producer      int   forward op that creates it; -1 for network inputs
    output_index  int   which output of the producer (0 for inputs: position among inputs)
    shape         tuple
    dtype         str
    bytes         int
    kind          str   "input" (network input, held by the caller), "feature_map"
                        (needed by some backward op: the maps PoocH classifies),
                        "intermediate" (no backward op needs it; freed after forward use,
                        or after ``held_until``) or "held" (needed in backward, and the
                        caller's code or a later backward pass holds it into backward: it
                        stays on the device, unclassified, until its last use or
                        ``held_until``, whichever is later)
    fwd_consumers list  forward ops that read it
    bwd_consumers list  backward ops that need it
    swap_out_s    float device -> host copy time on the profile's link
    swap_in_s     float host -> device copy time on the profile's link
    recompute_ops list  forward ops to re-run to rebuild it, in order, ending with producer
    recompute_sources list tensors that chain reads and does not rebuild itself
    recompute_s   float time to re-run that chain (the sum of its ops' rerun_s)
    can_keep, can_swap, can_recompute  bool  which classes are allowed
    why_not       str   why the disallowed ones are not allowed ("" when all are)
    held_until    int   last op during which something outside PoocH's control (a Variable
                        the caller's code holds, a function node keeping it for a backward
                        this pass does not run) still holds it, as measured; -1 when nothing
                        does past its last use (and for analytic profiles)
    nonzero       float fraction of its elements that are nonzero, as measured (what a sparse
                        encoding saves, pooch_ext/encodings.py); NaN where not measured

memory (device allocations in program order, attributed to ops)
    seq           int   global order
    op            int   op during which it happens
    kind          str   "malloc" | "free"
    bytes         int
    tensor        int   the activation tensor it belongs to, or -1
    category      str   "activation" | "gradient" | "transient" | "other"
  The order is the in-core (all-keep) one: a feature map is freed after its last backward
  use. Policies move feature-map frees; every other event stays where it is.

resident_bytes: parameters, their gradients and optimizer state, which no policy moves. A
  measured profile leaves out the gradients the training loop clears before backward (meta
  ``cleared_gradients``): they are "gradient" events (tensor -1) made by the first backward
  op of an op reading the parameter, and, if forward still held the last iteration's, held
  from op 0 to the end of forward (builder.ProfileBuilder.parameter_gradient).

action_s: host seconds the runtime spends on one schedule action of each kind (plan.ACTIONS),
  beyond any wait for a copy; measured by hooks/measured_profile.action_seconds on the CPU device,
  where the host's time is the iteration's. The simulator adds them where a plan acts. The
  hooks' own cost per op is ``runtime_s`` (gaps less the actions measured in them).

A Profile is checked when it is made and when it is loaded (profile_check.py): a value that
cannot be right raises ProfileError naming the table (or file), row and column.
"""
from __future__ import annotations

import hashlib
import json
import math
import pickle
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from pooch_ext.errors import ProfileError
from pooch_ext.links import Link
from pooch_ext.plan import ACTIONS
from pooch_ext.profile_format import (FORMAT_VERSION, HEADER_FILE, TABLES, format_shape,  # noqa: F401
                                      parse_frame, parse_int, read_header, read_table)
from pooch_ext.profile_check import (MAX_BYTES, MEMORY_CATEGORIES, MEMORY_KINDS,  # noqa: F401
                                     PHASES, TENSOR_KINDS, Problem, ProfileProblems, check_tables)

# ---------------------------------------------------------------- the profile

@dataclass
class Device:
    """The device the profile describes (a real GPU, a cost-model GPU, or the host simulation)."""

    name: str
    capacity_bytes: int
    kind: str = "analytic"  # "analytic" | "cuda" | "cpu" ("host-sim" in older profiles)

    def __post_init__(self) -> None:
        capacity = self.capacity_bytes
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) \
                or not 0 < capacity <= MAX_BYTES:
            raise ValueError(f"device capacity_bytes must be an integer in 1..{MAX_BYTES}, "
                             f"not {capacity!r}")
        if not isinstance(self.name, str) or not isinstance(self.kind, str):
            raise ValueError("device name and kind must be strings")


@dataclass
class Profile:
    """One training iteration: ops, tensors, memory events, resident bytes, device, link."""

    ops: pd.DataFrame
    tensors: pd.DataFrame
    memory: pd.DataFrame
    resident_bytes: int
    device: Device
    link: Link
    meta: dict = field(default_factory=dict)
    # host seconds the runtime spends on one schedule action of each kind (issuing a copy,
    # a release or wait whose copy had landed, a free), measured on the CPU device; absent
    # kinds cost 0 (analytic and GPU profiles: there the host runs ahead of the device)
    action_s: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems: list[Problem] = []
        self.ops = parse_frame("ops", self.ops, problems)
        self.tensors = parse_frame("tensors", self.tensors, problems)
        self.memory = parse_frame("memory", self.memory, problems)
        if problems:
            raise ProfileProblems(problems)
        self.ops["rerun_s"] = self.ops["rerun_s"].fillna(self.ops["duration_s"])
        try:
            self.resident_bytes = parse_int(self.resident_bytes)
        except (ValueError, TypeError, OverflowError):
            self.resident_bytes = -1
        if not 0 <= self.resident_bytes <= MAX_BYTES:
            raise ProfileError(f"resident_bytes must be an integer in 0..{MAX_BYTES}")
        if not isinstance(self.device, Device) or not isinstance(self.link, Link):
            raise ProfileError("device and link must be a profile.Device and a links.Link")
        if not isinstance(self.meta, dict):
            raise ProfileError("meta must be a dict")
        self.action_s = _action_seconds(self.action_s)
        self.check()
        self._checked_tables = self.tables_digest()

    # ------------------------------------------------------------ views
    @property
    def n_ops(self) -> int:
        return len(self.ops)

    @property
    def forward_ops(self) -> pd.DataFrame:
        return self.ops[self.ops.phase == "forward"]

    @property
    def backward_ops(self) -> pd.DataFrame:
        return self.ops[self.ops.phase == "backward"]

    @property
    def feature_maps(self) -> pd.DataFrame:
        """The tensors PoocH classifies (needed by some backward op)."""
        return self.tensors[self.tensors.kind == "feature_map"]

    @property
    def feature_map_bytes(self) -> int:
        return int(self.feature_maps["bytes"].sum())

    def memory_curve(self) -> np.ndarray:
        """Device bytes after each memory event of the in-core order (resident included)."""
        signed = np.where(self.memory["kind"].to_numpy() == "malloc", 1, -1)
        return self.resident_bytes + np.cumsum(signed * self.memory["bytes"].to_numpy(np.int64))

    def op_seconds(self) -> np.ndarray:
        """Seconds each op takes in an iteration: its compute (``duration_s``) plus the runtime
        around it (``runtime_s``: Python between functions, hooks, issuing copies)."""
        return self.ops["duration_s"].to_numpy(float) + self.ops["runtime_s"].to_numpy(float)

    @property
    def incore_time_s(self) -> float:
        """An all-keep iteration's seconds: every op once, nothing waited for."""
        return float(self.op_seconds().sum())

    @property
    def incore_peak_bytes(self) -> int:
        """Peak device memory of an all-keep run: what plain in-core training needs."""
        curve = self.memory_curve()
        return int(max(self.resident_bytes, curve.max() if len(curve) else 0))

    def summary(self) -> dict:
        """The one-screen facts (the CLI prints these; --json emits them)."""
        return {
            "model": self.meta.get("model", ""),
            "batch": self.meta.get("batch"),
            "source": self.meta.get("source", ""),
            "device": self.device.name,
            "capacity_bytes": int(self.device.capacity_bytes),
            "link": self.link.name,
            "ops": self.n_ops,
            "forward_ops": int(len(self.forward_ops)),
            "backward_ops": int(len(self.backward_ops)),
            "update_ops": int((self.ops.phase == "update").sum()),
            "tensors": int(len(self.tensors)),
            "feature_maps": int(len(self.feature_maps)),
            "feature_map_bytes": self.feature_map_bytes,
            "resident_bytes": self.resident_bytes,
            "incore_peak_bytes": self.incore_peak_bytes,
            "forward_s": float(self.op_seconds()[self.ops.phase.to_numpy() == "forward"].sum()),
            "backward_s": float(self.op_seconds()[self.ops.phase.to_numpy() == "backward"].sum()),
            "iteration_s": self.incore_time_s,
        }

    def with_link(self, link: Link) -> "Profile":
        """The same iteration on another link: swap times recomputed from tensor bytes."""
        tensors = self.tensors.copy()
        tensors["swap_out_s"] = [link.swap_out_s(b) for b in tensors["bytes"]]
        tensors["swap_in_s"] = [link.swap_in_s(b) for b in tensors["bytes"]]
        return Profile(self.ops.copy(), tensors, self.memory.copy(), self.resident_bytes,
                       self.device, link, dict(self.meta), dict(self.action_s))

    def without_configs(self) -> "Profile":
        """The same iteration with no op offering split configurations: planning as if
        every convolution had to run whole (the comparisons "without splitting")."""
        ops = self.ops.copy()
        ops["configs"] = [[] for _ in range(len(ops))]
        return Profile(ops, self.tensors.copy(), self.memory.copy(), self.resident_bytes,
                       self.device, self.link, dict(self.meta), dict(self.action_s))

    # ------------------------------------------------------------ equality
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Profile):
            return NotImplemented
        return (self.resident_bytes == other.resident_bytes and self.device == other.device
                and self.link == other.link and self.meta == other.meta
                and self.action_s == other.action_s
                and all(_frames_equal(getattr(self, t), getattr(other, t)) for t in TABLES))

    # ------------------------------------------------------------ persistence
    def save(self, directory: str | Path) -> Path:
        """Write profile.json + ops.csv, tensors.csv, memory.csv into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        header = {
            "format_version": FORMAT_VERSION,
            "resident_bytes": self.resident_bytes,
            "device": {"name": self.device.name, "capacity_bytes": int(self.device.capacity_bytes),
                       "kind": self.device.kind},
            "link": self.link.to_dict(),
            "meta": self.meta,
            "action_s": self.action_s,
            "rows": {name: int(len(getattr(self, name))) for name in TABLES},
        }
        (directory / HEADER_FILE).write_text(json.dumps(header, indent=2, sort_keys=True) + "\n")
        for name, columns in TABLES.items():
            frame = getattr(self, name).copy()
            for column in columns:
                frame[column.name] = [column.format(v) for v in frame[column.name]]
            frame.to_csv(directory / f"{name}.csv", index=False)
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> "Profile":
        """Read a folder written by ``save``; any defect raises ProfileError naming file and field."""
        directory = Path(directory)
        if not directory.is_dir():
            raise ProfileError(f"{directory}: not a profile folder (no such directory)")
        header = read_header(directory / HEADER_FILE)
        tables = {name: read_table(directory / f"{name}.csv", columns, header["rows"].get(name))
                  for name, columns in TABLES.items()}
        try:
            device = Device(**header["device"])
            link = Link(**header["link"])
        except (TypeError, ValueError) as error:
            raise ProfileError(f"{directory / HEADER_FILE}: field 'device'/'link': {error}") from None
        try:
            return cls(tables["ops"], tables["tensors"], tables["memory"], header["resident_bytes"],
                       device, link, header.get("meta", {}), header.get("action_s", {}))
        except ProfileProblems as error:
            raise ProfileProblems(error.problems, directory) from None
        except ProfileError as error:
            raise ProfileError(f"{directory / HEADER_FILE}: {error}") from None

    # ------------------------------------------------------------ consistency
    def check(self) -> None:
        """Raise ProfileError naming the first problem unless the tables are sound (they are
        checked when the profile is made; this sees edits made in place since)."""
        problems = check_tables(self.ops, self.tensors, self.memory)
        if problems:
            raise ProfileProblems(problems)

    def tables_digest(self) -> bytes:
        """A digest of the three tables, cells included (an edit in place changes it)."""
        digest = hashlib.blake2b(digest_size=20)
        for frame in (self.ops, self.tensors, self.memory):
            digest.update(pickle.dumps(frame, protocol=pickle.HIGHEST_PROTOCOL))
        return digest.digest()

    def check_unless_checked(self, tables_digest: bytes) -> None:
        """``check``, unless the tables (their ``tables_digest``) are still those checked when
        the profile was made: a profile is built every profiled iteration and compiled right
        after, and checking it twice cost a sixth of a build."""
        if tables_digest != getattr(self, "_checked_tables", None):
            self.check()

    def validate(self) -> list[str]:
        """Every problem of the tables, each naming table, row and column; [] when sound."""
        return [problem.where() for problem in check_tables(self.ops, self.tensors, self.memory)]


def _action_seconds(costs: object) -> dict[str, float]:
    """``action_s`` checked: schedule actions to finite seconds >= 0."""
    if not isinstance(costs, dict):
        raise ProfileError("action_s must be a dict of schedule action -> seconds")
    checked = {}
    for action, seconds in costs.items():
        if action not in ACTIONS:
            raise ProfileError(f"action_s: {action!r} is not a schedule action "
                               f"({', '.join(ACTIONS)})")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
                or not math.isfinite(seconds) or seconds < 0:
            raise ProfileError(f"action_s[{action!r}] must be finite seconds >= 0, got {seconds!r}")
        checked[action] = float(seconds)
    return checked


def _frames_equal(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        return False
    for column in a.columns:
        left, right = list(a[column]), list(b[column])
        if a[column].dtype == np.float64:
            if not np.array_equal(np.asarray(left, float), np.asarray(right, float), equal_nan=True):
                return False
        elif [list(x) if isinstance(x, (list, tuple)) else x for x in left] != \
                [list(x) if isinstance(x, (list, tuple)) else x for x in right]:
            return False
    return True
