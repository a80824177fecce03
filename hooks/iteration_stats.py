"""What the executor did in one iteration (``PoocH.iterations`` is made of these)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class IterationStats:
    """What the executor did in one iteration."""

    iteration: int
    program: str = ""
    deviation: str = ""
    swap_outs: int = 0
    swap_ins: int = 0
    recomputes: int = 0
    frees: int = 0
    encodes: int = 0
    decodes: int = 0
    inplace: int = 0              # forward ops that wrote over their input
    on_demand: int = 0
    room_releases: int = 0        # swapped maps released before their time: the op's room
    peak_bytes: int = 0
    started: float = 0.0                             # perf_counter at the first forward op
    finished: float = 0.0                            # perf_counter after the last backward op
    transfers: list = field(default_factory=list)    # (tensor, Transfer) of this iteration
    splits: dict = field(default_factory=dict)       # forward op -> (forward, backward) pieces
