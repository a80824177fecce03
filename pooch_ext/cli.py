"""The ``pooch-ext`` command: profile, classify, simulate, sweep.

Each subcommand lives in ``pooch_ext/commands/<name>.py`` with ``register(subparsers)`` and
``run(args) -> int``. User mistakes (PoochError, ValueError, and OSError: a file that cannot be
read or written) print one line and exit 2.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from pooch_ext.errors import PoochError

COMMANDS = ("profile", "classify", "simulate", "sweep")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage block
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pooch-ext", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMANDS:
        importlib.import_module(f"pooch_ext.commands.{name}").register(sub)
    return parser


# options whose value may look like an option to argparse ("--budget -1GiB"): passed as
# "--budget=-1GiB", so the value's own check says what is wrong with it
SIZE_OPTIONS = ("--budget", "--host-budget")


def _joined(argv: list[str]) -> list[str]:
    out: list[str] = []
    for word in argv:
        if out and out[-1] in SIZE_OPTIONS and word.startswith("-") and word[1:2].isdigit():
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_joined(sys.argv[1:] if argv is None else list(argv)))
    try:
        return int(args.run(args) or 0)
    except BrokenPipeError:
        # the reader left (`| head`): outputs are written before anything is printed, so the
        # work is done; what was left to print goes nowhere, and Python's own flush at exit too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (PoochError, ValueError, OSError) as error:
        print(f"pooch-ext {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pooch-ext: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
