"""C sources of pooch-ext compiled on first use, with the C compiler Python was built with,
into a per-user cache (``$XDG_CACHE_HOME/pooch-ext`` or ``~/.cache/pooch-ext``) keyed by the
source, the Python and the NumPy version, and written atomically, so parallel test workers
share one build. Where there is no compiler, callers fall back to Python and say why
(``failure``)."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import numpy as np

# the errors a build or its loading raise where this machine cannot have it
BUILD_ERRORS = (OSError, subprocess.SubprocessError, ImportError)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pooch-ext"


def compiled(source: Path, name: str, suffix: str, flags: list[str]) -> Path:
    """The built shared object of ``source`` (built now if the cache lacks it)."""
    key = hashlib.sha256(source.read_bytes() + " ".join(flags).encode() +
                         sys.version.encode() + np.__version__.encode())
    target = cache_dir() / f"{name}-{key.hexdigest()[:16]}{suffix}"
    if target.exists():
        return target
    compiler = (sysconfig.get_config_var("CC") or "cc").split()
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(suffix=target.suffix, dir=target.parent)
    os.close(handle)
    try:
        subprocess.run([*compiler, "-shared", "-fPIC", "-O2", "-std=c11", *flags, str(source),
                        "-o", temporary], check=True, capture_output=True, text=True,
                       timeout=120)
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return target


def failure(error: BaseException) -> str:
    """One line saying why a build failed (the compiler's last line where it spoke)."""
    detail = getattr(error, "stderr", "") or str(error)
    return f"{type(error).__name__}: {detail.strip().splitlines()[-1] if detail else ''}"
