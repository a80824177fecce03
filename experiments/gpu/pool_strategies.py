"""Per iteration of a recorded CuPy malloc/free log: the bytes held at most, what CuPy's pool
takes for the same requests (its total, which ``set_limit`` bounds), what one arena with
offsets planned from the blocks' lifetimes would take, and what one region would take with
each request placed as it comes, best fit (pooch_ext/placement.py).

    python experiments/gpu/pool_strategies.py results/demo/allocations.csv [--limit BYTES]

Each iteration starts from a compact pool holding the blocks the log shows live at its start
(allocated first, in their order), so one iteration's fragmentation is measured apart from
the last one's. Blocks held before the log began are not in it (parameters, data): the
figures are the log's own bytes. ``--limit`` also says whether CuPy's pool would have run out
of memory under that limit, counting the same bytes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pooch_ext.cupy_pool import replay  # noqa: E402
from pooch_ext.placement import Block, best_fit_extent, peak_held, plan_offsets  # noqa: E402

MIB = 2 ** 20


def iteration_blocks(log: pd.DataFrame, iteration: int) -> tuple[list[Block], list[tuple]]:
    """(the iteration's blocks with their lifetimes in event indices, its events as
    ``(kind, bytes, key)``: the blocks live at its start first, as mallocs, then its own,
    less the frees of blocks the log never allocated, which were held before it began)."""
    live: dict = {}
    for row in log[log.iteration < iteration].itertuples():
        if row.kind == "malloc":
            live[row.key] = row.bytes
        else:
            live.pop(row.key, None)
    steps = [("malloc", nbytes, key) for key, nbytes in live.items()]
    steps += [(row.kind, row.bytes, row.key)
              for row in log[log.iteration == iteration].itertuples()]
    opened: dict = {}
    blocks, events = [], []
    for kind, nbytes, key in steps:
        if kind == "malloc":
            opened[key] = (nbytes, len(events))
        elif key in opened:
            nbytes, start = opened.pop(key)
            blocks.append(Block(nbytes, start, len(events)))
        else:
            continue
        events.append((kind, nbytes, key))
    blocks += [Block(nbytes, start, len(events)) for nbytes, start in opened.values()]
    return blocks, events


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path, help="an allocations.csv (PoocH's profiled "
                                               "iterations on a GPU)")
    parser.add_argument("--limit", type=int, default=0, help="a pool limit in bytes to try")
    args = parser.parse_args(argv)
    if not args.log.is_file():
        parser.error(f"no such file: {args.log}")
    log = pd.read_csv(args.log)
    print("| iteration | held at most (MiB) | CuPy's pool (MiB) | planned arena (MiB) | "
          "best fit in one region (MiB) |" + (" CuPy under the limit |" if args.limit else ""))
    print("|---|---|---|---|---|" + ("---|" if args.limit else ""))
    for iteration in sorted(log.iteration.unique()):
        blocks, events = iteration_blocks(log, iteration)
        held, (_, extent) = peak_held(blocks), plan_offsets(blocks)
        total = replay(events).total_peak
        region = best_fit_extent(events)
        cells = [f"{iteration}", f"{held / MIB:.1f}", f"{total / MIB:.1f} ({total / held:.2f}x)",
                 f"{extent / MIB:.1f} ({extent / held:.2f}x)",
                 f"{region / MIB:.1f} ({region / held:.2f}x)"]
        if args.limit:
            oom = replay(events, args.limit).oom_event
            cells.append("fits" if oom is None else f"out of memory at event {oom}")
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
