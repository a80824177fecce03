"""The CuPy pool emulator (pooch_ext/cupy_pool.py) on small sequences whose outcome follows
by hand from CuPy v14.2's rules: best fit, split keeps the front, merge with free neighbours,
free_all_blocks returns whole blocks only, the limit checked again after free_all_blocks."""
from __future__ import annotations

import pytest

from pooch_ext.cupy_pool import PoolEmulator, PoolOutOfMemory, replay, round_size


def test_requests_round_up_to_512_bytes_and_zero_bytes_never_touch_the_pool():
    assert [round_size(n) for n in (1, 512, 513, 1000)] == [512, 512, 1024, 1024]
    pool = PoolEmulator()
    assert pool.malloc(0) == 0
    assert (pool.total_bytes(), pool.n_cuda_malloc) == (0, 0)


def test_a_split_leaves_a_free_remainder_that_a_request_of_its_size_reuses():
    pool = PoolEmulator()
    base = pool.malloc(4096)
    pool.free(base)
    assert pool.malloc(1000) == base                 # the front of the free block
    assert (pool.used_bytes(), pool.total_bytes(), pool.free_bytes()) == (1024, 4096, 3072)
    assert pool.n_free_blocks() == 1
    assert pool.malloc(3072) == base + 1024          # the remainder, right after it
    assert (pool.n_cuda_malloc, pool.n_free_blocks()) == (1, 0)


def test_a_free_merges_with_free_neighbours_of_its_block():
    pool = PoolEmulator()
    base = pool.malloc(3072)
    pool.free(base)
    x, y, z = pool.malloc(1024), pool.malloc(1024), pool.malloc(1024)
    assert (x, y, z) == (base, base + 1024, base + 2048)
    pool.free(x)
    pool.free(z)
    assert pool.n_free_blocks() == 2
    pool.free(y)                                     # merges with both
    assert pool.n_free_blocks() == 1
    assert pool.malloc(3072) == base
    assert pool.n_cuda_malloc == 1


def test_the_smallest_free_chunk_that_fits_is_taken():
    pool = PoolEmulator()
    big, small = pool.malloc(8192), pool.malloc(4096)
    pool.free(big)
    pool.free(small)
    assert pool.malloc(2048) == small
    assert pool.malloc(6144) == big


def test_total_stays_while_used_drops():
    pool = PoolEmulator()
    a, b = pool.malloc(4096), pool.malloc(2048)
    pool.free(a)
    pool.free(b)
    assert (pool.used_bytes(), pool.total_bytes()) == (0, 6144)
    assert (pool.used_peak, pool.total_peak) == (6144, 6144)


def test_free_all_blocks_returns_only_whole_free_blocks():
    pool = PoolEmulator()
    a, b = pool.malloc(4096), pool.malloc(8192)
    pool.free(b)
    assert pool.malloc(1024) == b                    # b's block is split now
    pool.free(a)
    assert pool.free_all_blocks() == 4096            # a's block; b's remainder stays
    assert (pool.total_bytes(), pool.used_bytes(), pool.n_free_blocks()) == (8192, 1024, 1)


def test_the_limit_raises_when_free_all_blocks_cannot_make_room():
    pool = PoolEmulator(limit=8192)
    pool.malloc(4096)
    pool.malloc(2048)
    with pytest.raises(PoolOutOfMemory) as caught:
        pool.malloc(4096)
    assert (caught.value.size, caught.value.total, caught.value.limit) == (4096, 6144, 8192)
    assert isinstance(caught.value, MemoryError)


def test_the_limit_does_not_raise_when_free_all_blocks_makes_room():
    pool = PoolEmulator(limit=12288)
    a = pool.malloc(4096)
    pool.malloc(4096)
    pool.free(a)                                     # a's block is cached: total 8192
    pool.malloc(8192)                                # 16384 > limit until a's block goes
    assert (pool.total_bytes(), pool.used_bytes(), pool.n_cuda_malloc) == (12288, 12288, 3)


def test_replay_pairs_frees_by_key_and_takes_unknown_frees_as_held_from_the_start():
    events = [("malloc", 4096, "a"), ("free", 2048, "old"), ("free", 4096, "a"),
              ("malloc", 1000, "b"), ("malloc", 2048, "c")]
    result = replay(events)
    assert result.unknown_frees == 1
    a, _, _, b, c = result.addresses
    assert b not in (0, a)                           # best fit: the held 2048, not a's 4096
    assert c == a                                    # 2048 no longer fits the held block's rest
    assert result.n_cuda_malloc == 1                 # a only; the held block was there
    assert (result.used_peak, result.total_peak) == (6144, 6144)
    assert result.total == [6144] * 5
    limited = replay(events + [("malloc", 8192, "d")], limit=8192)
    assert limited.oom_event == 5
