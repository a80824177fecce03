"""PoocH under ChainerMN data parallelism (issue 17): every rank profiles its own iterations,
and rank 0 decides for all, so every rank runs the same schedule and a refusal happens on
every rank at the same point.

At each decision (the first backward's refusal check, the profiling program, the plan) the
ranks' profiles are gathered on rank 0 and combined into one (``combine_profiles``: the
slowest rank's times, the largest bytes; the graphs must be the same), rank 0 decides on it,
and the combined profile with the decision, or the error, is broadcast: every rank returns the
same value or raises the same error (nobody is left waiting in a collective). ``comm`` is a
ChainerMN communicator (``rank``, ``size``, ``gather_obj``, ``bcast_obj``); nothing here
imports MPI.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import numpy as np
import pandas as pd

from pooch_ext.errors import PoochError, RanksDisagreeError
from pooch_ext.profile import Profile

T = TypeVar("T")
# the columns that must agree between ranks (the graph), and those combined by their maximum
_SAME = {"ops": ["phase", "name", "fwd_op", "inputs", "outputs", "needs"],
         "tensors": ["producer", "shape", "dtype", "bytes", "kind"]}
_LARGEST = {"ops": ["duration_s", "runtime_s", "rerun_s", "transient_bytes"],
            "tensors": ["swap_out_s", "swap_in_s"]}


def _ranks_text(values: list) -> str:
    return ", ".join(f"rank {rank}: {value}" for rank, value in enumerate(values))


def check_same_iteration(profiles: list[Profile], settings: list[dict]) -> None:
    """RanksDisagreeError naming the first difference between the ranks' iterations or
    PoocH settings (batch size, model, budget, ...)."""
    for what, values in (("PoocH settings", settings),
                         ("batch sizes", [p.meta.get("batch") for p in profiles]),
                         ("models", [p.meta.get("model") for p in profiles])):
        if any(v != values[0] for v in values[1:]):
            raise RanksDisagreeError(
                f"data-parallel ranks differ in their {what} ({_ranks_text(values)}); every "
                "rank must train the same model on the same batch size under the same PoocH")
    first = profiles[0]
    for rank, profile in enumerate(profiles[1:], start=1):
        for table, columns in _SAME.items():
            mine, theirs = getattr(first, table)[columns], getattr(profile, table)[columns]
            if len(mine) != len(theirs):
                where = f"{len(theirs)} {table} against {len(mine)}"
            else:
                differs = (mine.astype(str) != theirs.astype(str)).to_numpy()
                if not differs.any():
                    continue
                row, col = (int(v[0]) for v in np.nonzero(differs))
                where = (f"{table} row {row}, {columns[col]}: {theirs.iloc[row, col]} against "
                         f"{mine.iloc[row, col]}")
            raise RanksDisagreeError(
                f"rank {rank}'s training iteration differs from rank 0's ({where}); every rank "
                "must run the same graph on inputs of the same shape")


def combine_profiles(profiles: list[Profile]) -> Profile:
    """One profile for ranks that ran the same graph: the slowest rank's times and the
    largest scratch (a plan that fits and hides its copies on the slowest rank does on all);
    split configurations and meta of the rank with the highest in-core peak, and its memory
    events with every op's scratch the largest any rank measured (``_with_transients``: a rank
    may measure scratch at an op where another measured none, so their event lists differ)."""
    first = max(profiles, key=lambda p: p.incore_peak_bytes)
    tables = {}
    for table, columns in _LARGEST.items():
        frame = getattr(first, table).copy()
        for column in columns:
            frame[column] = np.max([getattr(p, table)[column].to_numpy() for p in profiles],
                                   axis=0)
        tables[table] = frame
    tables["memory"] = _with_transients(first.memory, tables["ops"]["transient_bytes"])
    rerun = tables["ops"]["rerun_s"].to_numpy()
    # a map's recompute time is its chain's rerun times (profile_check), summed again
    tables["tensors"]["recompute_s"] = [float(sum(rerun[k] for k in chain))
                                        for chain in tables["tensors"]["recompute_ops"]]
    action_s: dict[str, float] = {}
    for profile in profiles:
        for kind, seconds in profile.action_s.items():
            action_s[kind] = max(action_s.get(kind, 0.0), float(seconds))
    meta = dict(first.meta, ranks=len(profiles))
    return Profile(tables["ops"], tables["tensors"], tables["memory"],
                   max(p.resident_bytes for p in profiles), first.device, first.link, meta,
                   action_s)


def _with_transients(memory: pd.DataFrame, transient: pd.Series) -> pd.DataFrame:
    """``memory`` (events in op order, each op's scratch one malloc/free pair of category
    "transient", as the builder writes them) with each op's pair holding ``transient[op]``
    bytes: in the pair's place, or after the op's last allocation where it had none."""
    rows, events = [], memory.to_dict("records")
    by_op: dict[int, list[dict]] = {}
    for event in events:
        by_op.setdefault(int(event["op"]), []).append(event)
    for op in range(len(transient)):
        mine = by_op.get(op, [])
        group = [e for e in mine if e["category"] != "transient"]
        nbytes = int(transient.iloc[op])
        if nbytes > 0:
            # the old pair's place (only other events come before it), else after the op's
            # last allocation
            at = next((k for k, e in enumerate(mine) if e["category"] == "transient"), None)
            at = _after_last_malloc(group) if at is None else at
            pair = [dict(op=op, kind=kind, bytes=nbytes, tensor=-1, category="transient")
                    for kind in ("malloc", "free")]
            group = group[:at] + pair + group[at:]
        rows.extend(group)
    frame = pd.DataFrame(rows, columns=memory.columns.drop("seq"))
    frame.insert(0, "seq", range(len(frame)))
    return frame


def _after_last_malloc(group: list[dict]) -> int:
    mallocs = [k for k, e in enumerate(group) if e["kind"] == "malloc"]
    return mallocs[-1] + 1 if mallocs else 0


@dataclass
class Ranks:
    """The ranks of a ChainerMN communicator, deciding together."""

    comm: Any

    def __post_init__(self) -> None:
        missing = [name for name in ("rank", "size", "gather_obj", "bcast_obj",
                                     "multi_node_mean_grad") if not hasattr(self.comm, name)]
        if missing:
            raise PoochError(
                f"comm must be a ChainerMN communicator (chainermn.create_communicator(...)); "
                f"{type(self.comm).__name__} has no {', '.join(missing)}")

    @property
    def rank(self) -> int:
        return int(self.comm.rank)

    def agree(self, profile: Profile, decide: Callable[[Profile], T], settings: dict
              ) -> tuple[Profile, T]:
        """(the combined profile, ``decide(combined)``) on every rank, computed on rank 0;
        its exception, if any, raised on every rank."""
        gathered = self.comm.gather_obj((profile, settings))
        outcome: tuple | None = None
        if self.rank == 0:
            try:
                profiles = [p for p, _ in gathered]
                check_same_iteration(profiles, [s for _, s in gathered])
                combined = combine_profiles(profiles)
                outcome = ("value", combined, decide(combined))
            except Exception as error:   # noqa: BLE001 - raised on every rank below
                outcome = ("error",) + _portable(error)
        outcome = self.comm.bcast_obj(outcome)
        if outcome[0] == "error":
            raise _rebuilt(*outcome[1:])
        return outcome[1], outcome[2]


    def most(self, value: int) -> int:
        """The largest of every rank's ``value``, on every rank (a refusal all make)."""
        gathered = self.comm.gather_obj(int(value))
        return int(self.comm.bcast_obj(max(gathered) if self.rank == 0 else None))


class AllreduceMeter:
    """Times the gradient all-reduce (the communicator's ``multi_node_mean_grad``, which
    ChainerMN's optimizer runs in every update after the first, which only broadcasts) and
    measures its scratch with the device's allocation counter where it has one (the CPU
    device; on a GPU its time only): ``after_backward`` for the profile."""

    def __init__(self, comm: Any, counter: Any = None) -> None:
        self.comm, self.counter = comm, counter
        self.seconds: list[float] = []
        self.scratch: list[int] = []

    def install(self) -> None:
        original = self.comm.multi_node_mean_grad
        meter = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            with meter.counter.above_live(meter.scratch) if meter.counter is not None \
                    else nullcontext():
                began = time.perf_counter()
                try:
                    return original(*args, **kwargs)
                finally:
                    meter.seconds.append(time.perf_counter() - began)
        self.comm.multi_node_mean_grad = timed        # on this instance only

    def remove(self) -> None:
        vars(self.comm).pop("multi_node_mean_grad", None)

    def after_backward(self) -> tuple[float, int] | None:
        """(median seconds, largest scratch) of the all-reduces so far; None before any."""
        if not self.seconds:
            return None
        return float(np.median(self.seconds)), max(self.scratch, default=0)


def _portable(error: BaseException) -> tuple:
    """An exception as (class, args, attributes): our errors take other arguments than the
    message they keep, so pickling them whole would not rebuild them."""
    return type(error), error.args, dict(vars(error))


def _rebuilt(cls: type, args: tuple, attributes: dict) -> BaseException:
    error = cls.__new__(cls, *args)
    error.args = args
    vars(error).update(attributes)
    return error
