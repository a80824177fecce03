"""The CuPy pool's real peaks: a memory hook that sees every allocation, inside ops too
(im2col columns, temporaries), where op boundaries miss them. The CuPy device's peak, the
split measurement's scratch counter (hooks/conv_configs.py) and the GPU experiments use it;
and ``release_pool``, the clean start a pool limit needs."""
from __future__ import annotations

import gc
import math
import os
from typing import Any


def release_pool(cupy: Any) -> None:
    """Earlier work's garbage collected and the pool's cached blocks handed back, so that a
    limit set now, or a peak measured from now, counts what comes after alone (the limit
    binds everything the pool holds: a run held beside the next put 25 MB under a 9 MB one)."""
    gc.collect()
    cupy.cuda.Device().synchronize()
    cupy.get_default_memory_pool().free_all_blocks()


def pool_headroom() -> float:
    """``POOCH_GPU_POOL_HEADROOM`` (default 1): the CuPy device's pool limit is this times the
    budget the plan is made for. A diagnostic: with it above 1, a budgeted GPU run goes on where
    the pool's fragmentation (1.32-1.36x the bytes held, H200) would stop it, and measures
    what the plan held and what the pool took. Not a promise: the plan holds the budget, the
    pool may take up to this much more."""
    text = os.environ.get("POOCH_GPU_POOL_HEADROOM", "1")
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 1.0 <= value < math.inf:
        raise ValueError(f"POOCH_GPU_POOL_HEADROOM must be a finite number >= 1, not {text!r}")
    return value


def pool_peak_hook(cupy: Any) -> Any:
    """A CuPy memory hook that keeps the default pool's highest ``used_bytes`` (``peak``) and
    ``total_bytes`` (``total_peak``: used plus cached and split-off free blocks, what
    ``set_limit`` bounds) while it is entered (``with hook:``): the real peaks, inside ops too
    (im2col columns, temporaries), where ``CupyDevice.check`` only looks at op boundaries.
    ``reset()`` starts a new window."""
    pool = cupy.get_default_memory_pool()

    class PoolPeak(cupy.cuda.MemoryHook):
        def __init__(self) -> None:
            # CuPy keys entered hooks by name: one per instance, so hooks nest (a run's peak
            # around the split measurement's scratch counter)
            self.name = f"PoochPoolPeak-{id(self):x}"
            self.reset()

        def reset(self) -> None:
            self.peak = int(pool.used_bytes())
            self.total_peak = int(pool.total_bytes())

        def malloc_postprocess(self, **kwargs: Any) -> None:
            used = pool.used_bytes()
            if used > self.peak:
                self.peak = int(used)
            total = pool.total_bytes()
            if total > self.total_peak:
                self.total_peak = int(total)

    return PoolPeak()
