"""Gist's encodings as a fourth class (issue 16, ../shared/papers/gist.txt): a feature map
stored in a smaller form between its last forward use and its first backward use.

* ``binarize`` (lossless): a ReLU output that only ReLU's own backward reads needs one bit per
  element (Chainer's ReLU backward reads ``y > 0``; max pooling after it keeps its argmax,
  not its input). Gist's ReLU -> pool rule, checked on the real graph: every backward op
  that needs the map must be the producer's backward.
* ``sparse`` (lossless, Gist's SSDC): the nonzero elements and a bitmap of where they are;
  any map, worth it where most elements are zero (ReLU outputs feeding a convolution).
  "Nonzero" compares the elements' bits, so -0.0 and NaN come back exactly.
* ``fp16`` and ``fp8`` (lossy, Gist's delayed precision reduction; fp8 is Gist's 1-4-3
  format): opt-in only (settings "lossy" and "lossy-fp8").

How the planner sees an encoded map: the profile is rewritten (``encoded_profile``) so that
the map becomes an intermediate that its last forward reader frees, and a new feature map,
its *encoded form* (``uint8`` bytes), is made by that reader and needed by the first backward
op that needs the map; the decoded map is memory allocated there and freed where the map was.
The encoded form leaves once it is decoded, before that op allocates anything (the executor
drops it there). A binarized map decodes to its one-byte-per-element mask, not to a float
map: ReLU's backward reads only ``y > 0`` (hooks/relu_mask.py runs it on the mask).
Encoding and decoding cost their time on those two ops. Every policy then classifies the
encoded form like any map, so keep = encode and swap = encode + swap (the encoded bytes go
over the link). The executor carries it out with two more actions (hooks/codecs.py,
hooks/map_actions.py). The encoded form cannot be recomputed; a map whose recompute chain
reads an encoded map is not recomputed either (the chain would need the decoded map).

This module is the one home of which map may take which encoding; pooch_ext/codec_sizes.py
of the memory each codec takes, which hooks/codecs.py allocates exactly
(tests/test_encodings.py).
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from pooch_ext.errors import PoochError
from pooch_ext.codec_sizes import (CODECS, LOSSLESS, LOSSY, decoded_bytes, encoded_bytes,
                                   scratch_bytes)
from pooch_ext.inplace import inplace_of, inplace_profile
from pooch_ext.plan import ENCODED_CLASSES, Plan
from pooch_ext.profile import Profile
from pooch_ext.profile_format import format_shape

SETTINGS = ("none", "lossless", "lossy", "lossy-fp8")
LOSSY_CODEC = {"lossy": "fp16", "lossy-fp8": "fp8"}    # the narrower stash each allows
FLOATS = ("float16", "float32", "float64")
# analytic profiles: the fraction of a ReLU output's elements that are nonzero (half: the
# least sparse Gist reports for ReLU outputs); measured profiles count them ("nonzero")
RELU_NONZERO = 0.5
NONZERO_MARGIN = 0.05   # of the elements, above the most seen while profiling
# an encoding is offered only where it saves at least this fraction of the map
LEAST_SAVING = 0.25
WHY_ENCODED = "an encoded form: decoded, never recomputed"


def codecs_of(setting: str) -> tuple[str, ...]:
    """The codecs a setting allows."""
    setting = check_setting(setting)
    return LOSSLESS + (LOSSY_CODEC[setting],) if setting in LOSSY_CODEC else \
        LOSSLESS if setting == "lossless" else ()


def check_setting(setting: str | None) -> str:
    """'none' (None too: PoocH's default), 'lossless', 'lossy' (lossless + fp16 stashes) or
    'lossy-fp8' (lossless + fp8 stashes)."""
    setting = "none" if setting is None else setting
    if setting not in SETTINGS:
        raise PoochError(f"unknown encodings setting {setting!r}; known: {', '.join(SETTINGS)}")
    return setting


# ---------------------------------------------------------------- which map, which codec

def candidates(profile: Profile, setting: str = "lossless") -> pd.DataFrame:
    """One row per feature map that may be encoded, with its smallest allowed codec: tensor,
    codec, bytes, encoded_bytes, decoded_bytes, encode_s, decode_s, encode_after (its last
    forward reader), decode_at (its first backward reader), encode_scratch, decode_scratch
    (bytes)."""
    setting = check_setting(setting)
    columns = ["tensor", "codec", "bytes", "encoded_bytes", "decoded_bytes", "encode_s",
               "decode_s", "encode_after", "decode_at", "encode_scratch", "decode_scratch"]
    if setting == "none":
        return pd.DataFrame(columns=columns)
    ops, tensors = profile.ops, profile.tensors
    names, fwd_of = ops["name"].tolist(), ops["fwd_op"].tolist()
    backward_of = {f: k for k, f in enumerate(fwd_of) if f >= 0}
    seconds = _codec_seconds(profile)
    nonzero = tensors["nonzero"] if "nonzero" in tensors else pd.Series(math.nan, tensors.index)
    rows = []
    for row in tensors[tensors["kind"] == "feature_map"].itertuples():
        if row.dtype not in FLOATS or not row.can_keep or row.bytes == 0:
            continue
        last_forward = max(list(row.fwd_consumers) + [row.producer])
        if row.held_until >= min(row.bwd_consumers):
            continue           # the caller holds it into backward: encoding saves nothing
        n, itemsize = math.prod(row.shape), np.dtype(row.dtype).itemsize
        fraction = nonzero[row.Index]
        if not math.isnan(fraction):
            # another batch may be a little less sparse than the profiled ones
            fraction = min(1.0, fraction + NONZERO_MARGIN)
        else:
            fraction = RELU_NONZERO if names[row.producer] == "ReLU" else 1.0
        allowed = ["sparse"]
        if names[row.producer] == "ReLU" and \
                list(row.bwd_consumers) == [backward_of.get(row.producer, -2)]:
            allowed.append("binarize")
        narrow = LOSSY_CODEC.get(setting)
        if narrow and not (narrow == "fp16" and row.dtype == "float16"):
            allowed.append(narrow)
        nonzero_elements = round(fraction * n)
        sizes = {c: encoded_bytes(c, n, itemsize, nonzero_elements) for c in allowed}
        codec = min(allowed, key=lambda c: (sizes[c], CODECS.index(c)))
        if sizes[codec] > (1 - LEAST_SAVING) * row.bytes:
            continue
        encode_s, decode_s = seconds(codec, row.bytes, sizes[codec])
        rows.append((int(row.tensor), codec, int(row.bytes), sizes[codec],
                     decoded_bytes(codec, n, itemsize), encode_s, decode_s,
                     int(last_forward), int(min(row.bwd_consumers)),
                     *scratch_bytes(codec, n, itemsize, nonzero_elements)))
    return pd.DataFrame(rows, columns=columns)


def _codec_seconds(profile: Profile) -> Callable[[str, int, int], tuple[float, float]]:
    """(encode, decode) seconds of a map: measured rates per byte where the profile has them
    (meta ``codec_s_per_byte``), else the cost model's GPU (one memory-bound pass reading one
    form and writing the other), else the profile's ReLU ops' seconds per byte."""
    rates = profile.meta.get("codec_s_per_byte") or {}
    gpu_name = profile.meta.get("gpu")
    if gpu_name:
        from pooch_ext.analytic.costmodel import get_gpu
        gpu = get_gpu(gpu_name)
    relu = profile.ops[(profile.ops["name"] == "ReLU") & (profile.ops["phase"] == "forward")]
    out_bytes = profile.tensors.set_index("tensor")["bytes"]
    per_byte = [s / out_bytes[o[0]] for s, o in zip(relu["duration_s"], relu["outputs"])
                if o and out_bytes[o[0]] > 0]
    relu_rate = float(np.median(per_byte)) if per_byte else 0.0

    def seconds(codec: str, nbytes: int, encoded: int) -> tuple[float, float]:
        if codec in rates:
            encode_rate, decode_rate = rates[codec]
            return encode_rate * nbytes, decode_rate * nbytes
        if gpu_name:
            elements = nbytes / 4
            one_pass = gpu.time_s(elements, nbytes + encoded)
            return one_pass, one_pass
        return relu_rate * nbytes, relu_rate * nbytes
    return seconds


# ---------------------------------------------------------------- the rewritten profile

def twin_ids(profile: Profile, table: pd.DataFrame) -> dict[int, int]:
    """Encoded map -> the id of its encoded form (new ids after the profile's, in map order)."""
    first = int(profile.tensors["tensor"].max()) + 1
    return {int(t): first + k for k, t in enumerate(sorted(table["tensor"]))}


def encoded_profile(profile: Profile, table: pd.DataFrame) -> Profile:
    """``profile`` with the maps of ``table`` (rows of ``candidates``) stored encoded (see the
    module's docstring); the same profile when ``table`` is empty."""
    # Long on purpose: one rewrite of the three tables that must stay consistent with each
    # other (profile_check.py checks them); split, each part would need the others' state.
    if not len(table):
        return profile
    ops = profile.ops.copy()
    for column in ("outputs", "needs"):
        ops[column] = [list(v) for v in ops[column]]
    tensors = profile.tensors.copy()
    rows_of = {int(t): i for i, t in enumerate(tensors["tensor"])}
    twins = twin_ids(profile, table)
    duration = ops["duration_s"].to_numpy(float).copy()
    memory = profile.memory
    m_op, m_kind, m_tensor = (memory[c].tolist() for c in ("op", "kind", "tensor"))
    m_bytes, m_cat = memory["bytes"].tolist(), memory["category"].tolist()
    before: dict[int, list[tuple]] = {}   # op -> events before its own
    after: dict[int, list[tuple]] = {}    # op -> events after its own
    replaced: dict[int, tuple] = {}       # row of memory -> its replacement
    free_row = {t: r for r, (t, kind) in enumerate(zip(m_tensor, m_kind))
                if kind == "free" and t >= 0}
    readers: dict[int, list[int]] = {}     # tensor -> rows whose recompute chain reads it
    for r, sources in zip(tensors.index, tensors["recompute_sources"]):
        for source in sources:
            readers.setdefault(int(source), []).append(r)
    new_rows = []
    how: dict[str, dict] = {}             # the profile's meta["encoded"] (encoded_maps)
    for row in table.sort_values("tensor").itertuples():
        t, twin, last_fwd, first_bwd = int(row.tensor), twins[int(row.tensor)], \
            int(row.encode_after), int(row.decode_at)
        i = rows_of[t]
        bwd = list(tensors.at[i, "bwd_consumers"])
        how[str(t)] = dict(codec=str(row.codec), twin=twin, encode_after=last_fwd,
                           decode_at=first_bwd, last_use=max(bwd))
        for r in readers.get(t, ()):
            if tensors.at[r, "can_recompute"]:
                tensors.at[r, "can_recompute"] = False
                tensors.at[r, "why_not"] = _why(tensors.at[r, "why_not"],
                                                f"its recompute reads encoded map {t}")
        size = int(row.encoded_bytes)
        new_rows.append(dict(
            tensor=twin, producer=last_fwd, output_index=len(ops.at[last_fwd, "outputs"]),
            shape=(size,), dtype="uint8", bytes=size, kind="feature_map", fwd_consumers=[],
            bwd_consumers=[first_bwd], swap_out_s=profile.link.swap_out_s(size),
            swap_in_s=profile.link.swap_in_s(size), recompute_ops=[last_fwd],
            recompute_sources=list(ops.at[last_fwd, "inputs"]),
            recompute_s=float(profile.ops.at[last_fwd, "rerun_s"]), can_keep=True,
            can_swap=bool(tensors.at[i, "can_swap"]), can_recompute=False,
            why_not=WHY_ENCODED, held_until=-1, nonzero=math.nan))
        tensors.at[i, "kind"] = "intermediate"
        tensors.at[i, "bwd_consumers"] = []
        tensors.at[i, "recompute_ops"] = []
        tensors.at[i, "recompute_sources"] = []
        tensors.at[i, "recompute_s"] = 0.0
        ops.at[last_fwd, "outputs"].append(twin)
        for k in bwd:
            ops.at[k, "needs"] = [twin if (x == t and k == first_bwd) else x
                                  for x in ops.at[k, "needs"] if x != t or k == first_bwd]
        duration[last_fwd] += float(row.encode_s)
        duration[first_bwd] += float(row.decode_s)
        nbytes, decoded = int(row.bytes), int(row.decoded_bytes)
        replaced[free_row[t]] = (m_op[free_row[t]], "free", decoded, -1, "activation")
        # the map itself goes when nothing holds it any more (a Variable of the caller's
        # code may hold it a little longer: the profile's held_until)
        gone = max(last_fwd, int(tensors.at[i, "held_until"]))
        after.setdefault(last_fwd, []).extend(
            [(last_fwd, "malloc", size, twin, "activation")] + _scratch(last_fwd, row.encode_scratch))
        after.setdefault(gone, []).append((gone, "free", nbytes, t, "activation"))
        # decoded, the encoded form leaves before the op allocates: its bytes are handed
        # back here and taken again after the op, where the simulator frees it (the
        # simulator frees a map after its last reader; sim/model.py drops its free event)
        before.setdefault(first_bwd, []).extend(
            [(first_bwd, "malloc", decoded, -1, "activation")]
            + _scratch(first_bwd, row.decode_scratch)
            + [(first_bwd, "free", size, -1, "activation")])
        after.setdefault(first_bwd, []).extend([(first_bwd, "malloc", size, -1, "activation"),
                                                (first_bwd, "free", size, twin, "activation")])
    ops["duration_s"] = duration
    if "nonzero" not in tensors:
        tensors["nonzero"] = math.nan
    tensors = pd.concat([tensors, pd.DataFrame(new_rows)], ignore_index=True)
    events: list[tuple] = []
    ops_seen = sorted(set(m_op) | set(before) | set(after))
    by_op: dict[int, list[int]] = {}
    for r, k in enumerate(m_op):
        by_op.setdefault(k, []).append(r)
    for k in ops_seen:
        events.extend(before.get(k, ()))
        for r in by_op.get(k, ()):
            events.append(replaced.get(r, (k, m_kind[r], m_bytes[r], m_tensor[r], m_cat[r])))
        events.extend(after.get(k, ()))
    memory = pd.DataFrame(events, columns=["op", "kind", "bytes", "tensor", "category"])
    memory.insert(0, "seq", range(len(memory)))
    return dataclasses.replace(profile, ops=ops, tensors=tensors, memory=memory,
                               meta=dict(profile.meta, encoded=how))


def _scratch(op: int, nbytes: int) -> list[tuple]:
    """A codec's scratch at ``op``'s boundary: allocated and freed there."""
    return [(op, "malloc", int(nbytes), -1, "transient"),
            (op, "free", int(nbytes), -1, "transient")] if nbytes else []


def _why(old: str, new: str) -> str:
    return f"{old}; {new}" if old else new


# ---------------------------------------------------------------- the four-class search

def choices(table: pd.DataFrame) -> list[pd.DataFrame]:
    """The encoding sets the search tries, cheapest to decode first: none, binarized maps,
    those plus sparse maps that at least halve, every candidate."""
    halve = table["encoded_bytes"] <= table["bytes"] / 2
    return _unique([table.iloc[:0], table[table["codec"] == "binarize"],
                    table[(table["codec"] == "binarize") | halve], table])


def setting_choices(profile: Profile, setting: str) -> list[pd.DataFrame]:
    """The encoding sets ``classify`` tries for ``setting``: ``choices`` of its candidates;
    a lossy setting also tries the lossless sets, whose sparse maps its candidates store as
    fp16 or fp8 where that is smaller, so that allowing them never gives a slower plan."""
    sets = choices(candidates(profile, setting))
    if check_setting(setting) in LOSSY_CODEC:
        sets = _unique(choices(candidates(profile, "lossless")) + sets)
    return sets


def _unique(sets: list[pd.DataFrame]) -> list[pd.DataFrame]:
    """The sets in order, each (map, codec) combination once."""
    seen: list[set] = []
    unique: list[pd.DataFrame] = []
    for chosen in sets:
        key = set(zip(chosen["tensor"], chosen["codec"]))
        if key not in seen:
            seen.append(key)
            unique.append(chosen)
    return unique


def lossless_base(profile: Profile) -> Profile:
    """``profile`` with Gist's third lossless technique, its in-place ReLUs, wherever
    pooch_ext/inplace.py allows them: what every encoding set is applied to."""
    return inplace_profile(profile)


def classify(profile: Profile, classify_one: Callable[..., Plan], setting: str = "lossless",
             **kwargs: object) -> tuple[Profile, Plan]:
    """(the profile the plan runs on, the fastest plan over the plain profile and the
    encoding sets of ``setting_choices``, each with and without the in-place ReLUs of
    ``lossless_base``, each classified by ``classify_one(profile, **kwargs)``). With
    nothing better than the plain profile, its plan: never slower than without encodings,
    and "lossy" never slower than "lossless"; and never slower than without the in-place
    ReLUs, though less memory does not always make the search find a faster plan. A set
    whose plan does not fit (or that ``classify_one`` refuses, a budget below its minimum
    say) is passed over; if none fits, the plain profile's plan (which says why) or its
    refusal."""
    if check_setting(setting) == "none":
        return profile, classify_one(profile, **kwargs)
    started = time.perf_counter()
    best: tuple[Profile, Plan] | None = None
    plain_plan: Plan | None = None
    refusal: PoochError | None = None
    base = lossless_base(profile)
    bases = [base] if base is profile else [base, profile]
    for chosen, on in [(None, profile)] + [(c, b) for c in setting_choices(base, setting)
                                           for b in bases if len(c) or b is not profile]:
        target = profile if chosen is None else encoded_profile(on, chosen)
        try:
            plan = classify_one(target, **kwargs)
        except PoochError as error:
            refusal = refusal if chosen is not None else error
            continue
        if chosen is None:
            plain_plan = plan
        else:
            plan.encodings = {int(t): str(c) for t, c in zip(chosen["tensor"], chosen["codec"])}
            plan.inplace = inplace_of(target)
        if plan.feasible and (best is None or plan.iteration_time_s < best[1].iteration_time_s):
            best = (target, plan)
    if best is None:
        if plain_plan is None:
            assert refusal is not None
            raise refusal
        best = (profile, plain_plan)
    else:
        four_class_table(best[1], best[0])
    # the search's time, every set tried: what "classified in" means to whoever waited
    best[1].classify_seconds = time.perf_counter() - started
    return best


def four_class_table(plan: Plan, target: Profile) -> None:
    """The plan's classification table by map: an encoded map's row says what the map is
    (its producer, function, shape and bytes), its class "encode" (kept encoded) or
    "encode+swap" with its codec in ``encoding`` and the form's bytes in ``encoded_bytes``;
    its costs are the form's (what crosses the link)."""
    twins = {info.twin: info for info in encoded_maps(target).values()}
    table = plan.table
    if not len(table) or not twins:
        return
    table = table.copy()
    table["encoding"] = ""
    table["encoded_bytes"] = pd.array([None] * len(table), dtype="Int64")
    maps = target.tensors.set_index("tensor")
    for i in [i for i, t in enumerate(table["tensor"]) if t in twins]:
        info = twins[int(table.at[i, "tensor"])]
        producer = int(maps.at[info.tensor, "producer"])
        table.loc[i, ["tensor", "producer", "function", "label", "shape", "bytes", "class",
                      "encoding", "encoded_bytes"]] = [
            info.tensor, producer, target.ops.at[producer, "name"],
            target.ops.at[producer, "label"], format_shape(maps.at[info.tensor, "shape"]),
            int(maps.at[info.tensor, "bytes"]), ENCODED_CLASSES[table.at[i, "class"]],
            info.codec, int(table.at[i, "bytes"])]
    plan.table = table


def encoded_plan(profile: Profile, plan: Plan) -> tuple[Profile, Plan]:
    """(the profile ``plan`` runs on, the plan on it) for a plan read back from its table
    (Plan.read_csv): its in-place ops run in place, its encoded maps' forms take their
    classes. The same profile and plan when it does neither; an op or a map this profile
    cannot run or store that way is refused. A profile that already runs it (PoocH's
    ``pooch.profile``, saved: its maps already encoded as the plan says, its ReLUs in
    place) is the one it runs on as it is (refused before: no rule encodes a form again)."""
    done = {int(t): how["codec"] for t, how in (profile.meta.get("encoded") or {}).items()}
    if done and done == plan.encodings and inplace_of(profile) == list(plan.inplace):
        twins = {int(t): int(how["twin"]) for t, how in profile.meta["encoded"].items()}
        return profile, dataclasses.replace(
            plan, classes={twins.get(t, t): c for t, c in plan.classes.items()})
    profile = inplace_profile(profile, plan.inplace)
    if not plan.encodings:
        return profile, plan
    unknown = sorted({c for c in plan.encodings.values() if c not in CODECS})
    if unknown:
        raise PoochError(f"the plan stores maps as {unknown[0]!r}, an unknown encoding; "
                         f"known: {', '.join(CODECS)}")
    narrow = set(plan.encodings.values()) & set(LOSSY)
    setting = next((s for s, c in LOSSY_CODEC.items() if c in narrow), "lossless")
    allowed = candidates(profile, setting).set_index("tensor", drop=False)
    for t, codec in sorted(plan.encodings.items()):
        if t not in allowed.index or allowed.at[t, "codec"] != codec:
            why = (f"its encoding here is {allowed.at[t, 'codec']}" if t in allowed.index
                   else "no encoding rule allows it here")
            raise PoochError(f"the plan stores tensor {t} as {codec}, but {why}: a plan "
                             "table runs on the profile it was made from")
    chosen = allowed.loc[sorted(plan.encodings)].reset_index(drop=True)
    twins = twin_ids(profile, chosen)
    classes = {twins.get(t, t): c for t, c in plan.classes.items()}
    return encoded_profile(profile, chosen), dataclasses.replace(plan, classes=classes)


def footprint(profile: Profile, setting: str) -> tuple[int, int]:
    """(in-core peak bytes, in-core peak bytes with every ``setting`` encoding and the
    in-place ReLUs): Gist's measure, every map kept."""
    if check_setting(setting) == "none":
        return profile.incore_peak_bytes, profile.incore_peak_bytes
    base = lossless_base(profile)
    return profile.incore_peak_bytes, encoded_profile(
        base, candidates(base, setting)).incore_peak_bytes


@dataclass(frozen=True)
class Encoded:
    """One map an encoded profile stores encoded: what the executor needs to carry it out."""

    tensor: int
    codec: str
    twin: int            # the id of its encoded form (what the schedule acts on)
    encode_after: int    # its last forward reader: encoded at the boundary after it
    decode_at: int       # its first backward reader: decoded at the boundary before it
    last_use: int        # its last backward reader: the decoded map is freed after it


def encoded_maps(profile: Profile) -> dict[int, Encoded]:
    """Map -> how it is encoded, for a profile ``encoded_profile`` made; {} for any other."""
    return {int(t): Encoded(int(t), **info)
            for t, info in (profile.meta.get("encoded") or {}).items()}
