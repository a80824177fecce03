"""Output paths, checked when the arguments are parsed: a mistake is one line before any work.

A file output (``--out CSV``, ``--schedule``, ``--plot``) is written into a folder that must
exist; an existing file there is replaced. A folder output (``profile --out DIR``) is created,
with any missing parent folders, as its help says. Either must be writable.
"""
from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

FILE_HELP = "its folder must exist; an existing file is replaced"


def output_file(text: str, suffix: str = "") -> Path:
    """argparse type: a file path whose folder exists and takes a new file."""
    path = Path(text)
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty file name")
    if path.is_dir() or text.endswith(("/", os.sep)):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder, not a file name")
    if suffix and path.suffix.lower() != suffix:
        raise argparse.ArgumentTypeError(f"{text!r}: the file name must end in {suffix}")
    folder = path.parent
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(
            f"cannot write {text!r}: folder {str(folder)!r} "
            + ("is a file" if folder.exists() else "does not exist"))
    _check_writable(folder, text)
    return path


def png_file(text: str) -> Path:
    """argparse type: ``output_file`` ending in .png (what the figure is written as)."""
    return output_file(text, ".png")


def output_folder(text: str) -> Path:
    """argparse type: a folder path that is a folder or can be created, with its parents."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a folder")
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise argparse.ArgumentTypeError(f"cannot create {text!r}: {str(existing)!r} is a file")
    _check_writable(existing, text)
    return path


def _check_writable(folder: Path, text: str) -> None:
    """Create and remove a scratch file in ``folder`` (permission bits do not tell: root,
    read-only mounts, ACLs)."""
    try:
        handle, scratch = tempfile.mkstemp(prefix=".pooch-ext-", dir=folder)
        os.close(handle)
        os.unlink(scratch)
    except OSError as error:
        raise argparse.ArgumentTypeError(
            f"cannot write {text!r}: {error.strerror or error} in {str(folder)!r}") from None


def check_distinct(args: argparse.Namespace) -> None:
    """No output may replace an input or another output: ``--out`` into the profile folder
    left a profile that no longer loads, ``--schedule`` onto ``--plan`` replaced the plan
    read (ValueError: one line, exit 2, before any work)."""
    outputs = {name: Path(path).resolve() for name in ("out", "schedule", "plot")
               if (path := getattr(args, name, None)) is not None}
    profile = Path(args.profile_dir).resolve()
    plan = Path(args.plan).resolve() if getattr(args, "plan", None) else None
    seen: dict[Path, str] = {}
    for name, path in outputs.items():
        if path == plan or profile in path.parents:
            raise ValueError(f"--{name} {str(path)!r} would replace an input (the "
                             + ("plan read" if path == plan else "profile folder's files") + ")")
        if path in seen:
            raise ValueError(f"--{name} and --{seen[path]} are the same file {str(path)!r}")
        seen[path] = name
