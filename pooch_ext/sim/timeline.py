"""What one simulation found (RunResult) and, recorded, what ``engine.run(..., record=True)``
saw (a Recorder), turned into the Timeline users read (intervals per engine, memory per
boundary, stalls per map) and the schedule the executor replays."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from pooch_ext.sim.model import SimModel


@dataclass
class RunResult:
    """What one simulation found (cheap to make; the search uses it directly)."""

    time_s: float
    feasible: bool
    peak_bytes: int
    reason: str
    forward_end_s: float
    l_out: list[int]            # feature-map indices whose swap-out compute waited on / ran late
    l_in: list[int]             # feature-map indices whose swap-in a backward op waited on
    stall_d2h: np.ndarray       # (m,) seconds compute waited on each map's swap-out
    stall_h2d: np.ndarray       # (m,) seconds compute waited on each map's swap-in
    delayed: int                # swap-ins a fixed rule wanted earlier than memory allowed
    trace: dict | None = None   # intervals and actions (record=True)
    cut_short: bool = False     # stopped once it could not end before ``cutoff`` (run)
    host_peak_bytes: int = 0    # host bytes the swapped maps hold at once (model.host_peak)
    configs: np.ndarray | None = None   # chosen configuration per op that has them
    dur: np.ndarray | None = None       # (n,) seconds per op with those configurations


@dataclass
class Timeline:
    """A simulated iteration: time, memory, intervals per engine, stalls per tensor."""

    feasible: bool
    reason: str
    iteration_time_s: float
    forward_end_s: float
    peak_bytes: int
    budget_bytes: int
    link: str
    swap_in_timing: str
    ops: pd.DataFrame           # op, phase, name, start_s, end_s, stall_s (waiting for
                                # copies), recompute_s, host_s (the runtime issuing actions)
    transfers: pd.DataFrame     # tensor, direction (d2h/h2d), boundary, start_s, end_s, bytes
    recomputes: pd.DataFrame    # tensor, boundary, start_s, end_s
    memory: pd.DataFrame        # boundary, time_s, bytes, peak_bytes
    stalls: pd.DataFrame        # tensor, swap_out_stall_s, swap_in_stall_s, stall_s
    l_out: list[int] = field(default_factory=list)   # tensor ids (paper's L_O)
    l_in: list[int] = field(default_factory=list)    # tensor ids (paper's L_I)
    delayed_swap_ins: int = 0
    schedule: pd.DataFrame | None = None
    host_peak_bytes: int = 0              # host bytes swapped maps hold at once (memory.host_bytes)
    host_budget_bytes: int | None = None  # None: unlimited
    configs: dict[int, int] = field(default_factory=dict)   # op -> pieces, where not whole

    @property
    def total_stall_s(self) -> float:
        return float(self.stalls["stall_s"].sum()) if len(self.stalls) else 0.0


class Recorder:
    """Intervals and actions of one simulation, for the Timeline and the schedule."""

    def __init__(self, n: int) -> None:
        self.arrival = np.zeros(n + 1)
        self.start = np.zeros(n)
        self.actions: list[tuple[int, str, int]] = []
        self.transfers: list[tuple] = []
        self.recomputes: list[tuple] = []

    def arrive(self, b: int, t: float) -> None:
        self.arrival[b] = t

    def op(self, b: int, t: float) -> None:
        self.start[b] = t

    def action(self, b: int, kind: str, i: int) -> None:
        self.actions.append((b, kind, i))

    def transfer(self, i, direction, b, start, end) -> None:
        self.transfers.append((i, direction, b, start, end))

    def recompute(self, i, b, start, end) -> None:
        self.recomputes.append((i, b, start, end))

    def finish(self, level: np.ndarray, top: np.ndarray) -> dict:
        return {"arrival": self.arrival, "start": self.start, "actions": self.actions,
                "transfers": self.transfers, "recomputes": self.recomputes,
                "level": level.copy(), "top": top.copy()}


def build_timeline(model: SimModel, r: RunResult, budget: int, timing: str,
              host_budget: float = math.inf) -> Timeline:
    tr = r.trace
    assert tr is not None, "run(..., record=True) records the trace"
    tid = model.tensor
    n = model.n
    start = tr["start"]
    dur = model.dur if r.dur is None else r.dur
    end = start + dur
    rc = pd.DataFrame(tr["recomputes"], columns=["i", "boundary", "start_s", "end_s"])
    rc_time = np.zeros(n)
    if len(rc):
        inside = rc["boundary"].to_numpy() < n
        np.add.at(rc_time, rc["boundary"].to_numpy()[inside],
                  (rc["end_s"] - rc["start_s"]).to_numpy()[inside])
    arrival = tr["arrival"][:n]
    host = _host_seconds(model, tr["actions"], n)
    # what is left between arriving at a boundary and the op's start is waiting for copies
    # (the runs' stall_d2h / stall_h2d, summed per op), up to rounding
    stall = start - arrival - rc_time - host
    stall = np.where(stall > 1e-12 * np.maximum(1.0, start), stall, 0.0)
    ops = pd.DataFrame({"op": np.arange(n), "phase": model.phases, "name": model.names,
                        "start_s": start, "end_s": end, "stall_s": stall, "recompute_s": rc_time,
                        "host_s": host})
    transfers = pd.DataFrame(tr["transfers"], columns=["i", "direction", "boundary", "start_s", "end_s"])
    transfers.insert(0, "tensor", tid[transfers.pop("i").to_numpy(np.int64)] if len(transfers)
                     else pd.Series(dtype="int64"))
    transfers["bytes"] = model.nbytes[[model.index[t] for t in transfers["tensor"]]] \
        if len(transfers) else pd.Series(dtype="int64")
    rc.insert(0, "tensor", tid[rc.pop("i").to_numpy(np.int64)] if len(rc) else pd.Series(dtype="int64"))
    times = np.r_[start, r.time_s]
    memory = pd.DataFrame({"boundary": np.arange(n + 1), "time_s": times,
                           "bytes": tr["level"], "peak_bytes": tr["top"],
                           "host_bytes": tr["host"]})
    stalls = pd.DataFrame({"tensor": tid, "swap_out_stall_s": r.stall_d2h,
                           "swap_in_stall_s": r.stall_h2d})
    stalls["stall_s"] = stalls.swap_out_stall_s + stalls.swap_in_stall_s
    schedule = schedule_frame(model, tr["actions"])
    return Timeline(r.feasible, r.reason, r.time_s, r.forward_end_s, r.peak_bytes, budget,
                    model.link.name, timing, ops, transfers, rc, memory, stalls,
                    [int(tid[i]) for i in r.l_out], [int(tid[i]) for i in r.l_in], r.delayed,
                    schedule, r.host_peak_bytes,
                    None if math.isinf(host_budget) else int(host_budget),
                    {} if r.configs is None else model.configs.pieces_of(r.configs))


def _host_seconds(model: SimModel, actions: list[tuple[int, str, int]], n: int) -> np.ndarray:
    """(n,) the runtime's host seconds before each op for the actions at its boundary (a
    recompute's are inside its interval): issuing copies, releases, waits and frees."""
    host = np.zeros(n + 1)
    for b, kind, _ in actions:
        if kind != "recompute":
            host[b] += model.act_s.get(kind, 0.0)
    return host[:n]


def schedule_frame(model: SimModel, actions: list[tuple[int, str, int]]) -> pd.DataFrame:
    frame = pd.DataFrame(actions, columns=["boundary", "action", "i"])
    frame["tensor"] = model.tensor[frame.pop("i").to_numpy(np.int64)] if len(frame) else []
    frame["order"] = frame.groupby("boundary").cumcount() if len(frame) else []
    frame = frame[["boundary", "order", "action", "tensor"]].astype(
        {"boundary": "int64", "order": "int64", "tensor": "int64"})
    frame["action"] = frame["action"].astype(object)
    return frame.reset_index(drop=True)


# re-exported: the schedule's own checks (the executor's tests use them too)
