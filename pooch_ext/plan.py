"""Plan: a class for every feature map, and the schedule of actions that carries it out.

Policies decide the classes; the simulator turns classes into a schedule anchored to op
boundaries and predicts its time and memory; the executor replays the same schedule inside
Chainer. Because both follow one schedule, a plan the simulator says fits, fits.

Schedule (a DataFrame, one row per action, sorted by boundary then order)
    boundary  int  actions at boundary b run after op b-1 has finished and before op b starts;
                   b == n_ops means after the last op of the iteration
    order     int  position among the actions of the same boundary
    action    str  one of ACTIONS
    tensor    int  the feature map acted on

Actions (every feature-map free is explicit: the executor frees maps early, as simulated)
    swap_out   start copying the map device -> host on the D2H stream (it stays on the device)
    release    wait until its swap-out has finished, then drop the device copy
    swap_in    allocate the map on the device and start copying it host -> device (H2D stream)
    wait       block compute until its swap-in has finished
    recompute  re-run its recompute chain on the compute stream; its sources must be present
    free       drop the device copy without saving it (after its last use, or a
               recompute-class map after its last forward use)

Swap-in timing (how a policy wants swap-ins placed; the simulator implements each)
    early          paper 4.3: in order of first backward use, as early as memory allows
    previous-op    "without scheduling": with the backward op just before the first use
    previous-conv  SuperNeurons: with the backward of the preceding convolution
    vdnn           vDNN prefetch: one layer ahead, window up to the previous convolution
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from pooch_ext.errors import PoochError

if TYPE_CHECKING:
    from pooch_ext.sim.timeline import Timeline

CLASSES = ("keep", "swap", "recompute")
# the class of an encoded map's encoded form -> the map's class in the table (encodings.py)
ENCODED_CLASSES = {"keep": "encode", "swap": "encode+swap"}
ACTIONS = ("swap_out", "release", "swap_in", "wait", "recompute", "free")
SWAP_IN_TIMINGS = ("early", "previous-op", "previous-conv", "vdnn")
SCHEDULE_COLUMNS = ("boundary", "order", "action", "tensor")
TABLE_COLUMNS = ("tensor", "producer", "function", "label", "shape", "bytes", "class",
                 "swap_out_s", "swap_in_s", "recompute_s", "r", "stall_s")


def empty_schedule() -> pd.DataFrame:
    """A schedule with no actions yet, with the columns and dtypes of a real one."""
    return pd.DataFrame({"boundary": pd.Series(dtype="int64"), "order": pd.Series(dtype="int64"),
                         "action": pd.Series(dtype=object), "tensor": pd.Series(dtype="int64")})


@dataclass
class Plan:
    """What a policy decided, and (once simulated) how it runs and what it costs."""

    policy: str
    classes: dict[int, str]
    swap_in_timing: str = "early"
    feasible: bool | None = None          # None until simulated (sim.engine.simulate_plan)
    reason: str = ""
    schedule: pd.DataFrame = field(default_factory=empty_schedule)
    table: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(TABLE_COLUMNS)))
    iteration_time_s: float = float("nan")
    peak_bytes: int = 0
    budget_bytes: int = 0
    host_peak_bytes: int = 0              # host bytes the swapped maps hold at once
    host_budget_bytes: int | None = None  # None: unlimited host memory
    link: str = ""
    classify_seconds: float = 0.0
    timeline: Timeline | None = None   # the simulator's Timeline for this plan, when simulated
    # op -> pieces it runs in (split convolutions, sim/configs.py); ops left out run whole.
    # Empty before simulation means "choose them": the simulator fills in its choice
    configs: dict[int, int] = field(default_factory=dict)
    # feature map -> the encoding it is stored in between forward and backward (issue 16,
    # pooch_ext/encodings.py); its class is its encoded form's (keep: encode, swap: encode +
    # swap), which the schedule names by the encoded form's id
    encodings: dict[int, str] = field(default_factory=dict)
    # forward ops that write their output over their input (Gist's in-place ReLU,
    # pooch_ext/inplace.py)
    inplace: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        bad = {c for c in self.classes.values() if c not in CLASSES}
        if bad:
            raise ValueError(f"unknown class(es) {sorted(bad)}; known: {', '.join(CLASSES)}")
        if self.swap_in_timing not in SWAP_IN_TIMINGS:
            raise ValueError(f"unknown swap-in timing {self.swap_in_timing!r}; "
                             f"known: {', '.join(SWAP_IN_TIMINGS)}")
        self.classes = {int(t): c for t, c in self.classes.items()}
        self.configs = {int(k): int(p) for k, p in self.configs.items()}
        self.inplace = sorted({int(k) for k in self.inplace})
        if any(p < 1 for p in self.configs.values()):
            raise ValueError(f"a configuration runs in at least one piece: {self.configs}")

    @property
    def counts(self) -> dict[str, int]:
        """Number of feature maps per class, e.g. {'keep': 66, 'swap': 12, 'recompute': 27}."""
        values = list(self.classes.values())
        return {c: values.count(c) for c in CLASSES}

    def to_csv(self, path: str | Path) -> Path:
        """The classification table, one row per feature map (plus policy + timing columns)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        table = self.table.copy() if len(self.table) else pd.DataFrame(
            {"tensor": list(self.classes), "class": list(self.classes.values())})
        table["policy"] = self.policy
        table["swap_in_timing"] = self.swap_in_timing
        table["configs"] = format_configs(self.configs)
        if self.inplace:
            table["inplace"] = " ".join(str(k) for k in sorted(self.inplace))
        table.to_csv(path, index=False)
        return path

    @classmethod
    def read_csv(cls, path: str | Path) -> "Plan":
        """Classes (and policy / swap-in timing) back from a table written by ``to_csv``."""
        path = Path(path)
        if not path.is_file():
            raise PoochError(f"{path}: " + ("a folder, not a plan file (the CSV written by "
                                            "classify --out)" if path.is_dir()
                                            else "no such plan file"))
        try:
            table = pd.read_csv(path)
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as error:
            raise PoochError(f"{path}: not a plan CSV ({str(error).splitlines()[0]})") from None
        for column in ("tensor", "class"):
            if column not in table.columns:
                raise PoochError(f"{path}: missing field '{column}'")
        try:
            classes = {int(t): str(c) for t, c in zip(table["tensor"], table["class"])}
            if len(classes) < len(table):       # the last row would win, silently
                twice = table["tensor"][table["tensor"].duplicated()].iloc[0]
                raise ValueError(f"tensor {twice} has more than one row (one class per map)")
            # an encoded map's row (pooch_ext/encodings.py): its encoded form kept or swapped
            codecs = table["encoding"].fillna("").astype(str) if "encoding" in table else None
            encodings = {} if codecs is None else {
                t: codec for t, codec in zip(classes, codecs) if codec}
            form_class = {shown: form for form, shown in ENCODED_CLASSES.items()}
            for t, c in classes.items():
                if (c in form_class) != (t in encodings):
                    raise ValueError(
                        f"tensor {t} is {c} with encoding {encodings.get(t, '(none)')!r}: an "
                        f"encoded map is {' or '.join(form_class)} and names its codec")
            for t in encodings:
                classes[t] = form_class[classes[t]]
            policy = str(table["policy"].iloc[0]) if "policy" in table and len(table) else "file"
            timing = (str(table["swap_in_timing"].iloc[0])
                      if "swap_in_timing" in table and len(table) else "early")
            configs = (parse_configs(table["configs"].iloc[0])
                       if "configs" in table and len(table) else {})
            inplace = _op_list(table["inplace"]) if "inplace" in table else []
            return cls(policy=policy, classes=classes, swap_in_timing=timing, table=table,
                       configs=configs, encodings=encodings, inplace=inplace)
        except ValueError as error:
            raise PoochError(f"{path}: {error}") from None


def _op_list(column: pd.Series) -> list[int]:
    """The plan-wide list of op ids a table repeats on every row (its ``inplace`` column)."""
    values = {str(v).strip() for v in column.fillna("")}
    if len(values) > 1:
        raise ValueError(f"column 'inplace' differs between rows ({' / '.join(sorted(values))}):"
                         " it lists the plan's in-place ops once per row, the same on each")
    text = values.pop() if values else ""
    if not all(part.isdigit() for part in text.split()):
        raise ValueError(f"column 'inplace' must list op ids (whole numbers) separated by "
                         f"spaces, got {text!r}")
    return sorted({int(part) for part in text.split()})


def format_configs(configs: dict[int, int]) -> str:
    """op -> pieces as "op:pieces op:pieces" (the plan CSV's configs column)."""
    return " ".join(f"{op}:{pieces}" for op, pieces in sorted(configs.items()))


def parse_configs(text: object) -> dict[int, int]:
    """The inverse of ``format_configs``; empty or missing text: no split."""
    if not isinstance(text, str) or not text.strip():
        return {}
    pairs = [part.split(":") for part in text.split()]
    if any(len(pair) != 2 for pair in pairs):
        raise ValueError(f"configs {text!r} are not op:pieces pairs")
    return {int(op): int(pieces) for op, pieces in pairs}
