"""SimModel: a Profile compiled into flat arrays for the timeline simulator and the policies.

The simulator runs thousands of times inside a search, so everything that does not depend on
the classification is computed once here: op durations, the memory level every boundary has
when no feature map is ever freed, each op's internal peak, and per feature map its bytes,
producer, last forward use, backward needs, swap and recompute costs, and the extra memory
its recompute chain needs while it runs.

Memory: the rule is sim/memory.py's. ``base_level[b]`` is the level at boundary b with all
feature maps still alive; the class-dependent lifetimes (sim/lifetimes.py) are subtracted
from it.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from pooch_ext.links import Link, get_link
from pooch_ext.profile import Profile
from pooch_ext.sim.configs import OpConfigs, compile_configs, smallest
from pooch_ext.sim.memory import base_profile_levels

if TYPE_CHECKING:
    from pooch_ext.sim.lifetimes import Lifetimes

KEEP, SWAP, RECOMPUTE = 0, 1, 2
CODE = {"keep": KEEP, "swap": SWAP, "recompute": RECOMPUTE}
NAME = {v: k for k, v in CODE.items()}
CONV_MARKERS = ("Convolution", "Deconvolution")


def is_conv(name: str) -> bool:
    """Convolution functions (SuperNeurons and vDNN treat them specially)."""
    return any(marker in name for marker in CONV_MARKERS)


@dataclass
class SimModel:
    """The classification-independent arrays of one profile on one link."""

    n: int                      # number of ops; boundaries are 0..n
    n_fwd: int                  # first op that is not a forward op (first backward boundary)
    dur: np.ndarray             # (n,) compute seconds (an op with configurations: its fastest)
    names: list[str]
    phases: list[str]
    base_level: np.ndarray      # (n+1,) bytes at each boundary, no feature map ever dropped
    peak_inc: np.ndarray        # (n+1,) extra bytes inside op b above its boundary level
                                # (an op with configurations: its smallest, sim/configs.py)
    tensor: np.ndarray          # (m,) feature-map tensor ids, ascending
    index: dict[int, int]       # tensor id -> feature-map index
    nbytes: np.ndarray          # (m,) int64
    producer: np.ndarray        # (m,)
    last_fwd: np.ndarray        # (m,) last forward op that reads it (its producer if none)
    bwd_need: list[list[int]]   # backward ops that need it, ascending (never empty)
    bwd_first: np.ndarray       # (m,) first of bwd_need
    bwd_end: np.ndarray         # (m,) last of bwd_need + 1
    so_s: np.ndarray            # swap-out seconds
    si_s: np.ndarray            # swap-in seconds
    rc_s: np.ndarray            # recompute chain seconds
    rc_extra: np.ndarray        # bytes the chain needs beyond the map itself while it runs
    src_fm: list[list[int]]     # feature-map indices among the chain's sources
    can: np.ndarray             # (m, 3) bool: keep, swap, recompute allowed
    why_not: list[str]
    conv_bwd: np.ndarray        # backward op indices whose forward op is a convolution
    link: Link
    act_s: dict[str, float] = field(default_factory=dict)   # host seconds per action kind
    configs: OpConfigs = field(default_factory=lambda: OpConfigs(np.zeros(0, np.int64), [], [], []))
    # (n+1,) bytes held between ops that the level lacks, measured (Profile.meta's
    # held_between_ops; zeros for analytic profiles): beside a recompute run at that boundary
    between: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # answers a search asks for again and again (``search_memo``); None outside a search
    memo: dict | None = field(default=None, repr=False, compare=False)

    @property
    def m(self) -> int:
        return len(self.tensor)


HELD_BETWEEN_OPS = "held_between_ops"    # Profile.meta key: [[op, bytes], ...] (measured)

# compiled models by content (``fingerprint``), most recent last: a Profile is mutable, so
# neither its identity nor a flag on it says whether it still holds what was compiled
_CACHE: OrderedDict[bytes, SimModel] = OrderedDict()
CACHE_SIZE = 16


def fingerprint(tables_digest: bytes, profile: Profile, link: Link | None) -> bytes:
    """A digest of everything ``_compile`` reads: the three tables (``tables_digest``: cells
    included, so edits in place count), resident bytes, the action costs, the profile's link
    and ``link``."""
    digest = hashlib.blake2b(tables_digest, digest_size=20)
    digest.update(repr((profile.resident_bytes, profile.link, link,
                        sorted(profile.action_s.items()),
                        profile.meta.get(HELD_BETWEEN_OPS))).encode())
    return digest.digest()


def compile_profile(profile: Profile, link: Link | str | None = None) -> SimModel:
    """The SimModel of ``profile`` on ``link`` (None: the profile's own swap times).

    Cached by content, so the result depends only on what the profile holds now; a profile
    compiled for the first time is checked first (ProfileError), unless its tables are still
    those checked when it was made."""
    link_obj = None if link is None else get_link(link)
    tables = profile.tables_digest()
    key = fingerprint(tables, profile, link_obj)
    model = _CACHE.get(key)
    if model is None:
        profile.check_unless_checked(tables)
        model = _compile(profile, link_obj)
        _CACHE[key] = model
        while len(_CACHE) > CACHE_SIZE:
            _CACHE.popitem(last=False)
    _CACHE.move_to_end(key)
    return model


def _compile(profile: Profile, link: Link | None) -> SimModel:
    ops, tensors, memory = profile.ops, profile.tensors, profile.memory
    n = len(ops)
    phases = list(ops["phase"])
    n_fwd = next((k for k, p in enumerate(phases) if p != "forward"), n)
    fms = tensors[tensors["kind"] == "feature_map"].sort_values("tensor")
    index = {int(t): i for i, t in enumerate(fms["tensor"])}

    # memory: drop feature-map frees, keep every other event where it is
    is_fm_free = (memory["kind"].to_numpy() == "free") & memory["tensor"].isin(index).to_numpy()
    events = memory[~is_fm_free]
    signed = np.where(events["kind"].to_numpy() == "malloc", 1, -1) * events["bytes"].to_numpy(np.int64)
    base_level, peak_inc = base_profile_levels(profile.resident_bytes, events["op"].to_numpy(),
                                               signed, n)

    names = list(ops["name"])
    durations = profile.op_seconds()      # recomputation costs rerun_s alone (rc_s)
    configs = compile_configs(ops, events["op"].to_numpy(), signed,
                              events["category"].to_numpy() == "transient", peak_inc, durations)
    durations, peak_inc = smallest(configs, durations, peak_inc)
    nbytes = fms["bytes"].to_numpy(np.int64)
    if link is None:
        so_s, si_s = fms["swap_out_s"].to_numpy(float), fms["swap_in_s"].to_numpy(float)
    else:
        so_s = np.array([link.swap_out_s(b) for b in nbytes], float)
        si_s = np.array([link.swap_in_s(b) for b in nbytes], float)
    # a map something else holds past its last forward read can be released only after that
    last_fwd = np.array([max([p, h] + list(c)) for p, c, h in
                         zip(fms["producer"], fms["fwd_consumers"], fms["held_until"])],
                        np.int64)
    src_fm = [[index[s] for s in srcs if s in index] for srcs in fms["recompute_sources"]]
    tbytes = dict(zip(profile.tensors["tensor"].tolist(), profile.tensors["bytes"].tolist()))
    op_io = tuple(dict(zip(profile.ops.index, profile.ops[c]))
                  for c in ("inputs", "outputs", "transient_bytes"))
    rc_extra = np.array([_chain_extra(op_io, tbytes, list(chain), int(t))
                         for chain, t in zip(fms["recompute_ops"], fms["tensor"])], np.int64)
    fwd_ops = ops["fwd_op"].to_numpy()
    conv_bwd = np.array([k for k in range(n_fwd, n) if phases[k] == "backward"
                         and is_conv(names[int(fwd_ops[k])])], np.int64)
    bwd_need = [sorted(int(k) for k in c) for c in fms["bwd_consumers"]]
    return SimModel(
        n=n, n_fwd=n_fwd, dur=durations, names=names, phases=phases,
        base_level=base_level.astype(np.int64), peak_inc=peak_inc,
        tensor=fms["tensor"].to_numpy(np.int64), index=index, nbytes=nbytes,
        producer=fms["producer"].to_numpy(np.int64), last_fwd=last_fwd,
        bwd_need=bwd_need, bwd_first=np.array([v[0] for v in bwd_need], np.int64),
        bwd_end=np.array([v[-1] + 1 for v in bwd_need], np.int64),
        so_s=so_s, si_s=si_s, rc_s=fms["recompute_s"].to_numpy(float), rc_extra=rc_extra,
        between=_held_between(profile, n),
        src_fm=src_fm, can=fms[["can_keep", "can_swap", "can_recompute"]].to_numpy(bool),
        why_not=list(fms["why_not"]), conv_bwd=conv_bwd,
        link=profile.link if link is None else link, act_s=dict(profile.action_s),
        configs=configs)


def _held_between(profile: Profile, n: int) -> np.ndarray:
    between = np.zeros(n + 1, np.int64)
    for op, nbytes in profile.meta.get(HELD_BETWEEN_OPS) or []:
        if 0 <= int(op) <= n:
            between[int(op)] = int(nbytes)
    return between


def _chain_extra(op_io: tuple[dict, ...], tbytes: dict[int, int], chain: list[int],
                 target: int) -> int:
    """Peak bytes a recompute chain holds beyond ``target`` itself while it runs.

    Each chain op allocates its outputs and its transient scratch; an output is dropped as soon
    as no later chain op reads it (the target stays). ``op_io``: the profile's op inputs,
    outputs and transient bytes by op; ``tbytes``: bytes per tensor id.
    """
    if not chain:
        return 0
    inputs, outputs, transient = op_io
    last_read: dict[int, int] = {}
    for pos, k in enumerate(chain):
        for t in inputs[k]:
            last_read[t] = pos
    live: dict[int, int] = {}
    peak = 0
    for pos, k in enumerate(chain):
        for t in outputs[k]:
            live[t] = int(tbytes[t])
        peak = max(peak, sum(live.values()) + int(transient[k]))
        for t in [t for t in live if t != target and last_read.get(t, -1) <= pos]:
            del live[t]
    return max(0, peak - int(tbytes[target]))



@contextmanager
def search_memo(model: SimModel) -> Iterator[None]:
    """Within: ``lifetimes`` remembers its last answer (a search asks for a trial's bounds,
    its fit and its simulation one after another) and sim/bounds.py its arrays. All dropped
    on leaving, so that no array outlives the search: the CPU device counts every NumPy
    array alive as device memory, and the profile measured next would hold them."""
    outer = model.memo is not None
    if not outer:
        model.memo = {}
    try:
        yield
    finally:
        if not outer:
            model.memo = None


def per_search(model: SimModel, key: str, make: Callable[[], Any]) -> Any:
    """``make()``, kept in the search's memo (``search_memo``) under ``key``: what every
    simulation or bound of a search reads of ``model`` alone; made afresh outside a search."""
    if model.memo is None:
        return make()
    if key not in model.memo:
        model.memo[key] = make()
    return model.memo[key]



def swap_in_targets(model: SimModel, timing: str, order: list[int], first: np.ndarray) -> dict:
    """Earliest boundary each swap-in may start at under a fixed timing rule."""
    n_fwd = model.n_fwd
    if timing == "previous-op":
        return {i: max(int(first[i]) - 1, n_fwd) for i in order}
    if timing == "previous-conv":
        conv = model.conv_bwd
        out = {}
        for i in order:
            pos = np.searchsorted(conv, first[i]) - 1
            out[i] = int(conv[pos]) if pos >= 0 else n_fwd   # conv_bwd: backward ops only
        return out
    return {i: n_fwd for i in order}   # early, vdnn (vdnn adds its window at run time)


def compute_to_come(dur: np.ndarray, rc_s: np.ndarray, life: Lifetimes,
                    c_rc: float) -> np.ndarray:
    """(n+1,) what the compute engine still has to do after the recomputes at boundary b:
    the ops from b on and the recomputes (with their host seconds) at later boundaries, a
    little under (rounding). The clock plus this bounds a run's time from below."""
    at = np.zeros(len(dur) + 1)
    rebuilt = life.rc_point >= 0
    np.add.at(at, life.rc_point[rebuilt] - 1, rc_s[rebuilt] + c_rc)
    at[:-1] += dur
    return np.cumsum(at[::-1])[::-1] * (1 - 1e-12)


def swap_in_bound(t: float, queue: list[int], so_done: list[float], si_s: list[float],
                  first: list[int], to_come: list[float]) -> float:
    """At the forward end (clock ``t``): a lower bound of a run's time from its swap-ins, one
    after another on the H2D engine in need order (``queue``), none before its swap-out ends,
    each before its first need and the compute still to come there (``compute_to_come``);
    memory ignored. It sees a slow link's backward stalls half a run before they happen."""
    done = bound = t
    for i in queue:
        done = max(done, so_done[i]) + si_s[i]
        bound = max(bound, done + to_come[first[i]])
    return bound


def host_level(model: SimModel, codes: np.ndarray) -> np.ndarray:
    """(n+1,) host bytes held by swapped maps at each boundary, after its actions.

    The host memory rule, the executor's (hooks/executor.py): a swapped map's host copy is
    taken when its swap-out starts (the boundary after its producer) and kept until the
    iteration ends (``_free`` keeps it, ``on_iteration_end`` discards it), because a later
    backward pass over the same graph may need the map again. A swap-in does not give it back.
    """
    swapped = codes == SWAP
    added = np.bincount(model.producer[swapped] + 1, weights=model.nbytes[swapped],
                        minlength=model.n + 1)
    return np.cumsum(added.astype(np.int64))


def host_peak(model: SimModel, codes: np.ndarray) -> int:
    """The highest ``host_level``: host copies are only added until the iteration ends, so
    the level peaks at its end, at every swapped map's bytes (summed directly: the search
    asks this of every simulation)."""
    return int(model.nbytes[codes == SWAP].sum())


def codes_of(model: SimModel, classes: dict[int, str]) -> np.ndarray:
    """Class codes per feature map; maps a plan leaves out are kept. Bad input raises ValueError."""
    codes = np.zeros(model.m, np.int64)
    for t, c in classes.items():
        i = model.index.get(int(t))
        if i is None:
            raise ValueError(f"tensor {t} is not a feature map of this profile")
        code = CODE[c]
        if not model.can[i, code]:
            raise ValueError(f"tensor {t} cannot be {c}: {model.why_not[i] or 'not allowed'}")
        codes[i] = code
    return codes
