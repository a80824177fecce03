"""pooch_ext/placement.py: offsets planned from lifetimes never overlap a block live at the
same time, and reach the bytes held where greedy-by-size can."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pooch_ext.cupy_pool import round_size
from pooch_ext.placement import Block, best_fit_extent, peak_held, plan_offsets

ROOT = Path(__file__).resolve().parents[1]


def _overlaps(blocks: list[Block], offsets: list[int]) -> list[tuple[int, int]]:
    bad = []
    for a in range(len(blocks)):
        for b in range(a + 1, len(blocks)):
            x, y = blocks[a], blocks[b]
            in_time = x.start < y.end and y.start < x.end
            in_space = (offsets[a] < offsets[b] + round_size(y.nbytes)
                        and offsets[b] < offsets[a] + round_size(x.nbytes))
            if in_time and in_space:
                bad.append((a, b))
    return bad


@pytest.mark.parametrize("seed", range(6))
def test_no_two_blocks_live_together_share_an_address(seed):
    rng = np.random.default_rng(seed)
    blocks = []
    for _ in range(60):
        start = int(rng.integers(0, 100))
        blocks.append(Block(int(rng.integers(1, 5000)), start, start + int(rng.integers(1, 30))))
    offsets, extent = plan_offsets(blocks)
    assert _overlaps(blocks, offsets) == []
    assert extent >= peak_held(blocks)
    assert extent == max(o + round_size(b.nbytes) for o, b in zip(offsets, blocks))


def test_a_small_block_in_a_freed_large_ones_place_does_not_strand_the_next_large_one():
    """CuPy's pool splits the freed large chunk for the small request and must ask the driver
    for the next large one; planned, the small block goes beside it: the bytes held only."""
    from pooch_ext.cupy_pool import PoolEmulator

    big, small = 4096, 512
    pool = PoolEmulator()
    first = pool.malloc(big)
    pool.free(first)
    pool.malloc(small)
    pool.malloc(big)
    assert pool.total_peak == 2 * big
    blocks = [Block(big, 0, 2), Block(small, 2, 5), Block(big, 3, 6)]
    offsets, extent = plan_offsets(blocks)
    assert extent == peak_held(blocks) == big + small
    assert _overlaps(blocks, offsets) == []


def test_best_fit_in_one_region_reuses_merged_gaps_where_the_pool_asks_for_more():
    """The pool cannot merge free chunks of separate cudaMalloc'd blocks; one region can:
    two freed neighbours hold a request as large as both, and a freed top lowers the top."""
    from pooch_ext.cupy_pool import PoolEmulator

    events = [("malloc", 1024, "a"), ("malloc", 1024, "b"), ("malloc", 512, "c"),
              ("free", 1024, "a"), ("free", 1024, "b"), ("malloc", 2048, "d")]
    assert best_fit_extent(events) == 2560               # d in a + b's merged gap
    pool = PoolEmulator()
    keys = {}
    for kind, nbytes, key in events:
        if kind == "malloc":
            keys[key] = pool.malloc(nbytes)
        else:
            pool.free(keys.pop(key))
    assert pool.total_peak > 2560
    # the smallest gap that holds it, not the first; a freed top is the top again
    events = [("malloc", 4096, "a"), ("malloc", 512, "s"), ("malloc", 1024, "b"),
              ("malloc", 512, "t"), ("free", 4096, "a"), ("free", 1024, "b"),
              ("malloc", 1024, "c"), ("free", 512, "t"), ("malloc", 4096, "d")]
    assert best_fit_extent(events) == 6144      # c in b's gap (the smaller), d in a's


@pytest.mark.parametrize("seed", range(4))
def test_best_fit_never_needs_less_than_the_bytes_held(seed):
    rng = np.random.default_rng(seed)
    live, events, blocks, opened = [], [], [], {}
    for key in range(200):
        if live and rng.random() < 0.45:
            gone = live.pop(int(rng.integers(len(live))))
            events.append(("free", 0, gone))
            nbytes, start = opened.pop(gone)
            blocks.append(Block(nbytes, start, len(events)))
        nbytes = int(rng.integers(1, 9)) * 512
        events.append(("malloc", nbytes, key))
        opened[key] = (nbytes, len(events))
        live.append(key)
    blocks += [Block(n, s, len(events) + 1) for n, s in opened.values()]
    assert best_fit_extent(events) >= peak_held(blocks)


def test_sizes_are_rounded_as_the_pool_rounds_them():
    assert round_size(1) == 512 and round_size(512) == 512 and round_size(513) == 1024
    assert peak_held([Block(1, 0, 1), Block(1, 0, 1)]) == 1024


def test_pool_strategies_prints_each_iteration(tmp_path):
    rows = [(0, "malloc", 4096, 1), (0, "malloc", 512, 2), (0, "free", 4096, 1),
            (0, "malloc", 4096, 3), (0, "free", 512, 2), (0, "free", 4096, 3),
            (1, "malloc", 1024, 4), (1, "free", 1024, 4)]
    log = pd.DataFrame(rows, columns=["iteration", "kind", "bytes", "key"])
    log.insert(1, "seq", range(len(log)))
    log.insert(2, "op", -1)
    path = tmp_path / "allocations.csv"
    log.to_csv(path, index=False)
    out = subprocess.run([sys.executable, str(ROOT / "experiments/gpu/pool_strategies.py"),
                          str(path), "--limit", "5000"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("| 0") or
             line.startswith("| 1")]
    assert len(lines) == 2
    assert "fits" in lines[1]
