"""Host <-> device link presets: what a swap costs on the paper's machines and today's.

A swap of ``n`` bytes takes ``latency_s + n / bandwidth`` on its copy engine. The nominal
figures are per direction; ``pcie3`` uses the ~12 GB/s such links measure in practice
(DESIGN.md), the others their nominal rate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from pooch_ext.errors import check_name

GB = 1e9


@dataclass(frozen=True)
class Link:
    """One host<->device interconnect; bandwidths in bytes/s, per direction."""

    name: str
    d2h_bytes_per_s: float
    h2d_bytes_per_s: float
    latency_s: float = 10e-6

    def __post_init__(self) -> None:
        values = (self.d2h_bytes_per_s, self.h2d_bytes_per_s, self.latency_s)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                   for v in values) or not (values[0] > 0 and values[1] > 0 and values[2] >= 0):
            raise ValueError(f"link {self.name!r}: bandwidths must be finite and > 0, latency "
                             f"finite and >= 0")

    def swap_out_s(self, nbytes: float) -> float:
        """Seconds to copy ``nbytes`` device -> host."""
        return self.latency_s + float(nbytes) / self.d2h_bytes_per_s

    def swap_in_s(self, nbytes: float) -> float:
        """Seconds to copy ``nbytes`` host -> device."""
        return self.latency_s + float(nbytes) / self.h2d_bytes_per_s

    def to_dict(self) -> dict:
        return {"name": self.name, "d2h_bytes_per_s": self.d2h_bytes_per_s,
                "h2d_bytes_per_s": self.h2d_bytes_per_s, "latency_s": self.latency_s}


PRESETS: dict[str, Link] = {
    "pcie3": Link("pcie3", 12 * GB, 12 * GB),          # paper's x86 box: 16 nominal, ~12 measured
    "nvlink2": Link("nvlink2", 75 * GB, 75 * GB),       # paper's POWER9 box (NVLink 2.0 x2)
    "pcie4": Link("pcie4", 31.5 * GB, 31.5 * GB),
    "pcie5": Link("pcie5", 63 * GB, 63 * GB),
    "c2c": Link("c2c", 450 * GB, 450 * GB),             # Grace-Hopper NVLink-C2C
    # CPU scale: the CPU device's copy engines at this speed take about as long to move a
    # small network's feature maps as one core takes to compute on them, so swaps matter on
    # a CPU as they do on a GPU over PCIe (small-resnet b32: ~20 MiB of maps, ~150 ms compute)
    "cpu": Link("cpu", 0.25 * GB, 0.25 * GB, 50e-6),
}


def get_link(name: str | Link) -> Link:
    """A preset by name (or the Link itself); unknown names list the presets."""
    if isinstance(name, Link):
        return name
    check_name(name, PRESETS, "link")
    return PRESETS[name]
