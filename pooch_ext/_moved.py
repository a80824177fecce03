"""Modules that moved into subpackages (issue 13) stay importable under their old names for
one release: ``import pooch_ext.simulator`` gives the very module ``pooch_ext.sim.engine``
(same object, so patches and isinstance checks agree), with a DeprecationWarning naming the
new home."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings

MOVED = {
    "pooch_ext.simulator": "pooch_ext.sim.engine",
    "pooch_ext.simmodel": "pooch_ext.sim.model",
    "pooch_ext.batchsim": "pooch_ext.sim.batch",
    "pooch_ext.schedule_check": "pooch_ext.sim.check",
    "pooch_ext.timeline_plot": "pooch_ext.report.timeline",
    "pooch_ext.classtable": "pooch_ext.report.classtable",
    "pooch_ext.rescale": "pooch_ext.analytic.rescale",
    "pooch_ext.costmodel": "pooch_ext.analytic.costmodel",
    "pooch_ext.synthetic": "pooch_ext.analytic.synthetic",
    "pooch_ext.shapes": "pooch_ext.analytic.shapes",
    "pooch_ext.recompute_rules": "pooch_ext.functions",
    "pooch_ext.hooks.training": "pooch_ext.testing",
}

# names that left a module which stays: module -> (their new home, the names)
MOVED_NAMES = {
    "pooch_ext.hooks.profiler": ("pooch_ext.hooks.measured_profile", (
        "build_profile", "fit_link", "unmodelled_bytes", "runtime_seconds", "action_seconds",
        "cleared_gradients", "SLACK_BYTES")),
}


def moved_name(module: str, name: str) -> object:
    """``module.name`` for a name that moved (a module's ``__getattr__`` calls this), with a
    DeprecationWarning naming its new home; AttributeError for any other name."""
    new, names = MOVED_NAMES.get(module, ("", ()))
    if name not in names:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warnings.warn(f"{module}.{name} moved to {new}; the old name goes in the next release",
                  DeprecationWarning, stacklevel=3)
    return getattr(importlib.import_module(new), name)


class _MovedLoader(importlib.abc.Loader):
    def __init__(self, new: str):
        self.new = new
        self.spec = None

    def create_module(self, spec):
        warnings.warn(f"{spec.name} moved to {self.new}; the old name goes in the next release",
                      DeprecationWarning, stacklevel=2)
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        """The new module ran when it was imported; only give it back its own spec, which
        the import system replaced with the old name's."""
        module.__spec__ = self.spec


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedLoader(MOVED[fullname]))


def install() -> None:
    """Put the finder on ``sys.meta_path`` once."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
