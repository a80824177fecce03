"""The batched budget-free simulation equals one simulation per variant."""
from __future__ import annotations

import math

import numpy as np
import pytest

from pooch_ext.sim.batch import variant_times
from pooch_ext.sim.model import KEEP, RECOMPUTE, SWAP, compile_profile
from pooch_ext.sim.engine import run
from pooch_ext.analytic.synthetic import random_profile


@pytest.mark.parametrize("seed", [0, 3, 6])
def test_variants_match_single_runs(seed):
    model = compile_profile(random_profile(seed, n_layers=14))
    rng = np.random.default_rng(seed)
    for _ in range(3):
        codes = rng.choice([KEEP, SWAP, RECOMPUTE], size=model.m, p=[0.3, 0.4, 0.3])
        codes = np.where(model.can[np.arange(model.m), codes], codes, SWAP)
        changes = [(i, c) for i in np.flatnonzero(codes == SWAP) for c in (KEEP, RECOMPUTE)
                   if model.can[i, c]]
        batch = variant_times(model, codes, changes)
        for (i, c), t in zip(changes, batch):
            trial = codes.copy()
            trial[i] = c
            assert t == pytest.approx(run(model, trial, "early", math.inf).time_s, abs=1e-12)


def test_only_moves_from_swap_are_accepted(toy_profile):
    model = compile_profile(toy_profile)
    codes = np.full(model.m, KEEP)
    with pytest.raises(ValueError):
        variant_times(model, codes, [(0, RECOMPUTE)])
