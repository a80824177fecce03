"""Is results/ still what the code computes? Regenerate every simulated experiment and compare.

The check a refactoring must pass (issue 13: behaviour unchanged): ``run_all.py`` writes every
experiment into a fresh folder and each CSV there is compared with results/, cell by cell,
except the columns of wall-clock seconds (``*seconds``: how long classification took, which no
two runs share). Plans, schedules' outcomes, predicted times and peaks, classification tables:
all must be equal. Prints one line per file; exits 1 if anything differs or is missing.
(Measured results - demo, fidelity, overhead, overlap, gpu - are measurements, not compared.)

    python experiments/same_results.py [--compare DIR: a finished run_all output, no rerun]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"


def differences(new: Path, reference: Path = RESULTS) -> dict[str, str]:
    """CSV path (relative) -> what differs, for every CSV under ``new``; {} if all equal."""
    found = {}
    for path in sorted(new.rglob("*.csv")):
        name = str(path.relative_to(new))
        if name == "run_all.csv":
            continue
        old = reference / name
        if not old.exists():
            found[name] = "not in the reference"
            continue
        a, b = pd.read_csv(path), pd.read_csv(old)
        if list(a.columns) != list(b.columns) or len(a) != len(b):
            found[name] = f"shape {a.shape} / columns differ from the reference's {b.shape}"
            continue
        columns = [c for c in a.columns if not c.endswith("seconds")
                   and not a[c].equals(b[c])]
        if columns:
            rows = int((a[columns] != b[columns]).any(axis=1).sum())
            found[name] = f"{rows} rows differ in {', '.join(columns)}"
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare", type=Path, help="a finished run_all output folder")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        new = args.compare
        if new is None:
            sys.path.insert(0, str(Path(__file__).parent))
            import run_all
            new = Path(scratch)
            run_all.main(["--out-dir", str(new)])
        found = differences(new)
        for path in sorted(new.rglob("*.csv")):
            name = str(path.relative_to(new))
            if name != "run_all.csv":
                print(f"{'DIFFERS' if name in found else 'same   '} {name}"
                      + (f": {found[name]}" if name in found else ""))
    print("results/ unchanged" if not found else f"{len(found)} file(s) differ from results/")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
