"""Byte quantities as people write them ("16GiB", "500 MB") and as we print them."""
from __future__ import annotations

import math
import re

MAX_BYTES = 1 << 53      # any byte count: far beyond any device, and exact as a float
# the capacity a device without a memory limit reports (the CPU device without a budget)
UNLIMITED = 1 << 50
MAX_SECONDS = 1e6        # any op or copy time (11.6 days): beyond it, sums over an
#                          iteration lose the other ops' times to rounding

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4, "p": 1000**5, "pb": 1000**5,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4, "pib": 1024**5,
}
_PATTERN = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | int | float, allow_zero: bool = False) -> int:
    """Parse '16GiB', '16 GB', '1.5e9', 2**30 into a positive byte count (``allow_zero``: or
    0, for a host budget, where none at all means "never swap")."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        match = _PATTERN.match(str(text))
        if not match:
            raise ValueError(f"not a byte size: {text!r} (examples: 16GiB, 500MB, 1e9)")
        value, unit = float(match.group(1)), match.group(2).lower()
    if unit not in _UNITS:
        raise ValueError(f"unknown byte unit {unit!r} in {text!r} (use B, KB, MB, GB, TB, PB, "
                         "KiB, MiB, GiB, TiB, PiB)")
    scaled = value * _UNITS[unit]
    if not math.isfinite(scaled):
        raise ValueError(f"byte size must be a finite number: {text!r}")
    if isinstance(text, str) and _UNITS[unit] == 1 and scaled != int(scaled):
        # "0.5" was 0 ("must be positive"); a float computed in Python is rounded, as before
        raise ValueError(f"a byte count is a whole number: {text!r} (or give a unit: 0.5GiB)")
    result = int(round(scaled))
    if result > MAX_BYTES:
        raise ValueError(f"byte size must be at most {MAX_BYTES} (8 PiB): {text!r}")
    if result < 0 or (result == 0 and not allow_zero):
        raise ValueError(f"byte size must be {'>= 0' if allow_zero else 'positive'}: {text!r}")
    return result


_BINARY = (("PiB", 1024**5), ("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2),
           ("KiB", 1024))


def binary_unit(n: float) -> tuple[str, int]:
    """The largest binary unit not above ``|n|`` and its bytes; ("B", 1) below a KiB."""
    return next(((unit, scale) for unit, scale in _BINARY if abs(n) >= scale), ("B", 1))


def format_bytes(n: float) -> str:
    """Binary units, three significant figures: 17179869184 -> '16.0 GiB'."""
    n = float(n)
    unit, scale = binary_unit(n)
    if scale == 1:
        return f"{n:.0f} B"
    return f"{n / scale:.3g} {unit}" if n / scale < 100 else f"{n / scale:.0f} {unit}"
