"""Replay a recorded CuPy malloc/free trace through the pool emulator: used and total peaks,
cudaMallocs, whether a limit would have run out of memory, and how well the emulator's
placement matches the real pointers.

    python experiments/gpu/pool_replay.py results/demo/allocations.csv --limit 50000000

The peaks come from a replay that starts from an empty pool (blocks freed but never
allocated in the trace are taken as held from the start). The match rate replays from a
start rebuilt out of the real pointers instead (every address range the trace touches is
free in the pool at the start, cut into blocks at 2 MiB boundaries no chunk crosses, since
cudaMalloc starts large blocks there; the blocks freed but never allocated are in use), and
per malloc compares the emulated pointer with the real one; after a mismatch the real
placement is forced, so each malloc is judged from the real state (as far as it is known).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pooch_ext.cupy_pool import TIES, PoolEmulator, replay, round_size  # noqa: E402

MIB = 2 ** 20
ALIGN = 2 ** 21


def rebuilt_start(events: list[tuple[str, int, int]]) -> tuple[list[tuple[int, int]], dict, dict]:
    """Blocks ``(base, size)`` the trace's pointers cover; unknown frees held from the start,
    and those (allocated between recorded windows) to claim only just before their free."""
    seen: set[int] = set()
    intervals, malloced, unknown = [], [], {}
    for i, (kind, nbytes, key) in enumerate(events):
        if kind == "malloc" and key:
            seen.add(key)
            intervals.append((key, key + round_size(nbytes)))
            malloced.append((i, key, key + round_size(nbytes)))
        elif kind == "free" and key not in seen and key not in unknown:
            unknown[key] = (i, nbytes)
            intervals.append((key, key + nbytes))
    regions: list[list[int]] = []
    crossed: set[int] = set()
    for start, end in sorted(intervals):
        crossed.update(range((start // ALIGN + 1) * ALIGN, end, ALIGN))
        if regions and start <= regions[-1][1]:
            regions[-1][1] = max(regions[-1][1], end)
        else:
            regions.append([start, end])
    blocks = []
    for start, end in regions:
        cuts = [m for m in range((start // ALIGN + 1) * ALIGN, end, ALIGN) if m not in crossed]
        edges = [start, *cuts, end]
        blocks += [(a, b - a) for a, b in zip(edges, edges[1:])]
    at_start, later = {}, {}
    for key, (i, nbytes) in unknown.items():
        clash = any(j < i and s < key + nbytes and key < e for j, s, e in malloced)
        (later if clash else at_start)[key] = nbytes
    return blocks, at_start, later


def _force(pool: PoolEmulator, address: int, nbytes: int) -> None:
    if not pool.claim(address, nbytes):
        pool.add_block(address, nbytes)
        pool.claim(address, nbytes)


def match_rate(events: list[tuple[str, int, int]], tie: str) -> tuple[int, int]:
    """(mallocs placed at the real pointer, mallocs) from the rebuilt start, as above."""
    blocks, at_start, later = rebuilt_start(events)
    pool = PoolEmulator(0, tie)
    for base, size in blocks:
        pool.add_block(base, size)
    for key, nbytes in at_start.items():
        _force(pool, key, nbytes)
    hits = total = 0
    for kind, nbytes, key in events:
        if kind == "malloc" and key:
            address = pool.malloc(nbytes)
            total += 1
            hits += address == key
            if address != key:
                pool.free(address)
                _force(pool, key, round_size(nbytes))
        elif kind == "free":
            if key in later:
                _force(pool, key, later.pop(key))
            pool.free(key) if key in pool._in_use else None
    return hits, total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("allocations", type=Path, help="allocations.csv (kind, bytes, key)")
    parser.add_argument("--limit", type=int, default=0, help="set_limit in bytes (0: none)")
    parser.add_argument("--tie", choices=TIES, default="newest",
                        help="which of several free chunks of one size to take")
    args = parser.parse_args(argv)
    frame = pd.read_csv(args.allocations)
    events = [(k, int(b), int(p)) for k, b, p in zip(frame.kind, frame.bytes, frame.key)]
    result = replay(events, tie=args.tie)
    ratio = result.total_peak / result.used_peak if result.used_peak else float("nan")
    print(f"{args.allocations}: {len(events)} events, {result.unknown_frees} frees of blocks "
          f"held before the trace")
    print(f"used peak   {result.used_peak / MIB:10.2f} MiB")
    print(f"total peak  {result.total_peak / MIB:10.2f} MiB  (total/used {ratio:.3f})")
    print(f"cudaMallocs {result.n_cuda_malloc:10d}")
    hits, mallocs = match_rate(events, args.tie)
    print(f"match       {hits}/{mallocs} mallocs at the real pointer ({hits / max(mallocs, 1):.2%})")
    if args.limit:
        limited = replay(events, limit=args.limit, tie=args.tie)
        if limited.oom_event is None:
            print(f"limit {args.limit:,} bytes: no OutOfMemoryError")
        else:
            row = frame.iloc[limited.oom_event]
            print(f"limit {args.limit:,} bytes: OutOfMemoryError at event {limited.oom_event} "
                  f"(iteration {row.iteration}, seq {row.seq}, op {row.op}, {row.bytes:,} bytes)")


if __name__ == "__main__":
    main()
