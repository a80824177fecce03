"""Profiles without a GPU: trace a Chainer model once (``tracing``), rescale the traced graph
to another batch or input size (``rescale`` with the per-function ``shapes`` rules), cost every
op with a roofline model of a named GPU (``costmodel``), and random networks for tests
(``synthetic``).

``from pooch_ext.analytic import analytic_profile`` keeps working (the names of the former
``pooch_ext/analytic.py``); they are looked up lazily so that the planning core, which imports
``analytic.costmodel`` and ``analytic.shapes``, never imports chainer.
"""
from __future__ import annotations

_TRACING_NAMES = ("OPTIMIZER", "MAX_SIZE_PART", "parse_size", "resolve_input_size", "ModelTrace",
                  "trace_model", "trace_network", "rescaled_trace", "profile_from_trace",
                  "analytic_profile")


def __getattr__(name: str):
    if name in _TRACING_NAMES:
        from pooch_ext.analytic import tracing
        return getattr(tracing, name)
    raise AttributeError(f"module 'pooch_ext.analytic' has no attribute {name!r}")
