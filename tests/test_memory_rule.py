"""The memory rule (pooch_ext/sim/memory.py), one clause at a time, by hand-counted cases."""
from __future__ import annotations

import numpy as np

from pooch_ext.sim.memory import base_profile_levels, levels_from_changes, occupy, tops


def test_an_ops_events_move_the_level_from_its_boundary_on_and_its_high_point_is_its_peak():
    # op 0 allocates 10 and keeps it; op 1 allocates 5 of scratch and frees it; op 2 frees 4
    op_of = np.array([0, 1, 1, 2])
    signed = np.array([10, 5, -5, -4])
    level, peak_inc = base_profile_levels(100, op_of, signed, n=3)
    assert level.tolist() == [100, 110, 110, 106]
    assert peak_inc.tolist() == [10, 5, 0, 0]


def test_an_interval_holds_bytes_from_its_start_up_to_but_not_at_its_end():
    levels = np.zeros(5, np.int64)
    occupy(levels, 1, 3, 7)
    occupy(levels, 2, 5, -2)
    assert levels.tolist() == [0, 7, 5, -2, -2]
    occupy(levels, 3, 3, 9)                      # an empty interval holds nothing
    assert levels.tolist() == [0, 7, 5, -2, -2]


def test_changes_at_boundaries_hold_from_there_on_and_tops_add_the_larger_extra():
    base = np.array([10, 10, 10, 10])
    level = levels_from_changes(base, np.array([0, -4, 0, 4, 99]))   # longer: cut to the level
    assert level.tolist() == [10, 6, 6, 10]
    assert tops(level, np.array([1, 5, 0, 0]), np.array([3, 2, 0, 0])).tolist() == [13, 11, 6, 10]
