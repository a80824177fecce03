"""The on-disk form of a Profile: a folder with profile.json (scalars, device, link, row
counts) and ops.csv, tensors.csv, memory.csv, one column per field of the contract
(profile.py). Every cell is parsed by its column's rule, and what cannot be read is reported
with table, row and column; a folder that is not a profile is refused by name.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from pooch_ext.errors import ProfileError
from pooch_ext.profile_check import MAX_BYTES, Problem


FORMAT_VERSION = 1
HEADER_FILE = "profile.json"


# ---------------------------------------------------------------- column specs
# Each column has a cell type; CSV stores lists as space-separated ints, shapes as "2x3x4".

def _missing(text: Any) -> bool:
    return text is None or (isinstance(text, float) and math.isnan(text))


def parse_int(value: Any) -> int:
    """An integer cell: int, integral float or decimal text; never a bool, a fraction or NaN."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError("a boolean is not an integer")
    if isinstance(value, (float, np.floating)):
        if not float(value).is_integer():
            raise ValueError("not an integer")
        value = int(value)
    number = int(value.strip()) if isinstance(value, str) else int(value)
    if abs(number) > MAX_BYTES:
        raise OverflowError(f"beyond {MAX_BYTES}")
    return number


def _parse_held(value: Any) -> int:
    """held_until: -1 where missing (nothing holds the tensor past its last use)."""
    return -1 if _missing(value) else parse_int(value)


def _parse_runtime(value: Any) -> float:
    """runtime_s: 0 where missing (analytic profiles, folders saved before it existed)."""
    return 0.0 if _missing(value) else _parse_float(value)


def _parse_rerun(value: Any) -> float:
    """rerun_s: NaN where missing, filled with the op's duration_s by the Profile."""
    return math.nan if _missing(value) or value == "" else _parse_float(value)


def _parse_fraction(value: Any) -> float:
    """nonzero: NaN where missing or not measured."""
    return math.nan if _missing(value) or value == "" else _parse_float(value)


def _parse_float(value: Any) -> float:
    if isinstance(value, (bool, np.bool_)):
        raise ValueError("a boolean is not a number")
    return float(value)


def _ints(text: Any, sep: str | None) -> list[int]:
    """A cell's integers: a sequence as it is, text split at ``sep``; empty or missing: []."""
    if isinstance(text, (list, tuple, np.ndarray)):
        return [parse_int(v) for v in text]
    text = "" if _missing(text) else str(text).strip()
    return [parse_int(part) for part in text.split(sep)] if text else []


def _parse_int_list(text: Any) -> list[int]:
    return _ints(text, None)


def _format_int_list(values: Any) -> str:
    return " ".join(str(int(v)) for v in values)


def parse_configs(text: Any) -> list[tuple[int, int, float]]:
    """configs: an op's split configurations as (pieces, transient bytes, seconds), written
    "pieces:bytes:seconds" separated by spaces; [] where missing (no alternative)."""
    if isinstance(text, (list, tuple)):
        entries = [tuple(entry) for entry in text]
    else:
        text = "" if _missing(text) else str(text).strip()
        entries = [tuple(part.split(":")) for part in text.split()] if text else []
    configs = []
    for entry in entries:
        if len(entry) != 3:
            raise ValueError(f"{entry!r} is not pieces:bytes:seconds")
        configs.append((parse_int(entry[0]), parse_int(entry[1]), _parse_float(entry[2])))
    return configs


def _format_configs(values: Any) -> str:
    return " ".join(f"{int(p)}:{int(b)}:{float(s)!r}" for p, b, s in values)


def _parse_shape(text: Any) -> tuple[int, ...]:
    return tuple(_ints(text, "x"))


def format_shape(shape: Any) -> str:
    """(2, 3, 4) -> '2x3x4': how profiles (and the tables made from them) write shapes."""
    return "x".join(str(int(v)) for v in shape)


def _parse_bool(text: Any) -> bool:
    if isinstance(text, (bool, np.bool_)):
        return bool(text)
    lowered = str(text).strip().lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _parse_str(text: Any) -> str:
    return "" if _missing(text) else str(text)


@dataclass(frozen=True)
class Column:
    name: str
    parse: Callable[[Any], Any]
    format: Callable[[Any], Any] = lambda v: v
    optional: bool = False      # folders saved before the column existed load without it


OPS_COLUMNS = (
    Column("op", parse_int), Column("phase", _parse_str), Column("name", _parse_str),
    Column("label", _parse_str), Column("fwd_op", parse_int), Column("duration_s", _parse_float),
    Column("inputs", _parse_int_list, _format_int_list),
    Column("outputs", _parse_int_list, _format_int_list),
    Column("needs", _parse_int_list, _format_int_list),
    Column("transient_bytes", parse_int),
    Column("runtime_s", _parse_runtime, optional=True),
    Column("rerun_s", _parse_rerun, optional=True),
    Column("configs", parse_configs, _format_configs, optional=True),
)
TENSORS_COLUMNS = (
    Column("tensor", parse_int), Column("producer", parse_int), Column("output_index", parse_int),
    Column("shape", _parse_shape, format_shape), Column("dtype", _parse_str),
    Column("bytes", parse_int), Column("kind", _parse_str),
    Column("fwd_consumers", _parse_int_list, _format_int_list),
    Column("bwd_consumers", _parse_int_list, _format_int_list),
    Column("swap_out_s", _parse_float), Column("swap_in_s", _parse_float),
    Column("recompute_ops", _parse_int_list, _format_int_list),
    Column("recompute_sources", _parse_int_list, _format_int_list),
    Column("recompute_s", _parse_float),
    Column("can_keep", _parse_bool), Column("can_swap", _parse_bool),
    Column("can_recompute", _parse_bool), Column("why_not", _parse_str),
    Column("held_until", _parse_held, optional=True),
    Column("nonzero", _parse_fraction, optional=True),
)
MEMORY_COLUMNS = (
    Column("seq", parse_int), Column("op", parse_int), Column("kind", _parse_str),
    Column("bytes", parse_int), Column("tensor", parse_int), Column("category", _parse_str),
)
TABLES = {"ops": OPS_COLUMNS, "tensors": TENSORS_COLUMNS, "memory": MEMORY_COLUMNS}
SCALAR_TYPES: dict[Callable[[Any], Any], Any] = {parse_int: "int64", _parse_float: "float64",
                                                 _parse_bool: bool}
EXPECTED = {parse_int: "an integer", _parse_held: "an integer", _parse_float: "a number",
            _parse_bool: "true or false", _parse_runtime: "a number", _parse_rerun: "a number",
            _parse_fraction: "a number",
            _parse_int_list: "integers separated by spaces",
            _parse_shape: "a shape such as 2x3x4",
            parse_configs: "pieces:bytes:seconds entries separated by spaces"}


def parse_frame(table: str, rows: list[dict] | pd.DataFrame, problems: list[Problem]) -> pd.DataFrame:
    """Rows as a frame with exactly the contract's columns and cell types; what cannot be
    read goes to ``problems`` (a missing number or boolean column, an unreadable cell).
    (Read column by column from the rows as given: a profile is built every profiled
    iteration, and a frame made first, then cell by cell, cost most of that.)"""
    columns = TABLES[table]
    cells_of = _column_cells(rows)
    parsed: dict[str, Any] = {}
    for column in columns:
        cells = cells_of(column.name)
        if cells is None:
            if column.parse in SCALAR_TYPES:
                problems.append(Problem(table, None, column.name, "missing"))
                continue
            cells = [math.nan] * len(rows)
        typed = _whole_column(column, cells)
        if typed is not None:
            parsed[column.name] = typed
            continue
        values = []
        for row, cell in enumerate(cells):
            try:
                values.append(column.parse(cell))
            except (ValueError, TypeError, OverflowError) as error:
                why = f" ({error})" if str(error).startswith("beyond") else ""
                problems.append(Problem(table, row, column.name, f"cannot read {cell!r} as "
                                                                 f"{EXPECTED[column.parse]}{why}"))
                break
        parsed[column.name] = (np.asarray(values, dtype=SCALAR_TYPES[column.parse])
                               if column.parse in SCALAR_TYPES else values)
    if problems:
        return pd.DataFrame(rows)
    return pd.DataFrame(parsed, columns=[c.name for c in columns])


def _column_cells(rows: list[dict] | pd.DataFrame) -> Callable[[str], Any]:
    """name -> that column's cells (None where no row has it): a frame's column, or dict
    rows' values as given (NaN where a row lacks a key another row has)."""
    if isinstance(rows, pd.DataFrame):
        return lambda name: rows[name] if name in rows.columns else None
    names = set().union(*rows) if rows else set()
    return lambda name: [row.get(name, math.nan) for row in rows] if name in names else None


# cell types each rule reads as they are (what the profilers' dict rows hold): a column of
# only these is taken whole, not cell by cell (a profile is built every profiled iteration)
_PLAIN_TYPES: dict[Callable[[Any], Any], tuple[type, ...]] = {
    parse_int: (int, np.int64), _parse_float: (float, np.float64), _parse_bool: (bool, np.bool_),
    _parse_str: (str,)}


def _whole_column(column: Column, cells: list | pd.Series) -> np.ndarray | list | None:
    """A column whose every cell its rule would read unchanged, typed as the rule types it,
    or None (then each cell is read): a frame's number or boolean column that already has
    its type, or dict rows' cells that all have the exact types of ``_PLAIN_TYPES`` (lists
    of such ints for integer lists); integers within MAX_BYTES either way."""
    if isinstance(cells, pd.Series):
        if column.parse not in SCALAR_TYPES:
            return None
        dtype = np.dtype(SCALAR_TYPES[column.parse])
        if cells.dtype.kind != dtype.kind:
            return None
        array = cells.to_numpy().astype(dtype)
    elif not cells:
        return None
    elif column.parse is _parse_int_list:
        if all(type(cell) is list and all(type(v) is int and -MAX_BYTES <= v <= MAX_BYTES
                                          for v in cell) for cell in cells):
            return [list(cell) for cell in cells]
        return None
    else:
        plain = _PLAIN_TYPES.get(column.parse)
        if plain is None or not all(type(cell) in plain for cell in cells):
            return None
        if column.parse is _parse_str:
            return list(cells)
        try:
            array = np.asarray(cells, dtype=SCALAR_TYPES[column.parse])
        except OverflowError:       # an int beyond int64: read cell by cell, which names it
            return None
    if array.dtype.kind == "i" and len(array) and max(int(array.max()),
                                                      -int(array.min())) > MAX_BYTES:
        return None
    return array


def read_header(path: Path) -> dict:
    if not path.is_file():
        raise ProfileError(f"{path.parent}: not a profile folder ({path.name} missing; a "
                           f"profile folder holds {HEADER_FILE}, "
                           f"{', '.join(f'{t}.csv' for t in TABLES)})")
    try:
        header = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ProfileError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(header, dict):
        raise ProfileError(f"{path}: expected a JSON object")
    for key in ("format_version", "resident_bytes", "device", "link", "rows"):
        if key not in header:
            raise ProfileError(f"{path}: missing field '{key}'")
    if header["format_version"] != FORMAT_VERSION:
        raise ProfileError(f"{path}: field 'format_version' is {header['format_version']!r}, "
                           f"this pooch-ext reads {FORMAT_VERSION}")
    if type(header["resident_bytes"]) is not int or not 0 <= header["resident_bytes"] <= MAX_BYTES:
        raise ProfileError(f"{path}: field 'resident_bytes' must be an integer in 0..{MAX_BYTES}")
    for key in ("device", "link", "rows", "meta", "action_s"):
        if not isinstance(header.get(key, {}), dict):
            raise ProfileError(f"{path}: field '{key}' must be an object")
    return header


def read_table(path: Path, columns: tuple[Column, ...], expected_rows: int | None) -> pd.DataFrame:
    if not path.is_file():
        raise ProfileError(f"{path}: missing")
    try:
        raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        raise ProfileError(f"{path}: empty file (expected a header row)") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as error:
        raise ProfileError(f"{path}: not a readable CSV ({str(error).splitlines()[0]})") from None
    missing = [c.name for c in columns if c.name not in raw.columns and not c.optional]
    if missing:
        raise ProfileError(f"{path}: missing field(s) {', '.join(repr(m) for m in missing)}")
    if expected_rows is not None and len(raw) != expected_rows:
        raise ProfileError(f"{path}: {len(raw)} rows, the header promises {expected_rows} "
                           "(file truncated?)")
    if not path.read_bytes().endswith(b"\n"):   # save() ends every line: a cut last row
        raise ProfileError(f"{path}: the last line has no end (file truncated?)")
    return raw
