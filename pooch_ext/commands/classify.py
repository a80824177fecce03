"""pooch-ext classify (being written)."""
from __future__ import annotations

import argparse

from pooch_ext.errors import PoochError


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("classify", help="(not yet available)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    raise PoochError("'classify' is not implemented yet")
