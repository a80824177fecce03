"""The ``pooch-ext`` command: profile, classify, simulate.

Each subcommand lives in ``pooch_ext/commands/<name>.py`` with ``register(subparsers)`` and
``run(args) -> int``. User mistakes (PoochError, ValueError, and OSError: a file that cannot be
read or written) print one line and exit 2.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from pooch_ext.errors import PoochError

COMMANDS = ("profile", "classify", "simulate")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage block
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pooch-ext", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMANDS:
        importlib.import_module(f"pooch_ext.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (PoochError, ValueError, OSError) as error:
        print(f"pooch-ext {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pooch-ext: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
