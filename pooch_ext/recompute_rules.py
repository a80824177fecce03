"""Alias of the recompute entries of ``pooch_ext.functions`` (their home), kept for one
release."""
from __future__ import annotations

from pooch_ext.functions import RECOMPUTABLE, recompute_refusal

__all__ = ["RECOMPUTABLE", "recompute_refusal"]
