"""PoocHReport: a Trainer extension that reports what PoocH does every iteration, for
``PrintReport`` and ``LogReport`` (``trainer.extend(pooch.extension())``)."""
from __future__ import annotations

from typing import Any

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer


class PoocHReport(chainer.training.Extension):
    """Reports ``pooch/profiling`` (1 while profiling), ``pooch/peak_mib`` (accounted device
    peak), ``pooch/compute_s`` (forward + backward seconds) and the executor's action counts."""

    trigger = (1, "iteration")
    priority = chainer.training.PRIORITY_WRITER
    name = "PoocHReport"

    def __init__(self, pooch: Any) -> None:
        self.pooch = pooch

    def __call__(self, trainer: Any) -> None:
        runtime = self.pooch.runtime
        if runtime is None or runtime.stats.iteration < 0:
            return
        stats = runtime.stats
        chainer.reporter.report({
            "pooch/profiling": float(self.pooch.phase == "profile"),
            "pooch/peak_mib": runtime.device.peak / 2**20,
            "pooch/compute_s": max(0.0, stats.finished - stats.started),
            "pooch/swaps": float(stats.swap_outs),
            "pooch/recomputes": float(stats.recomputes),
        })
