"""pooch-ext: profiling-based out-of-core hybrid training (PoocH) for Chainer 7.

Importing this package makes chainer work on NumPy 2 (see ``_compat``); installed, pooch-ext
does that for ``import chainer`` alone too (``_pooch_ext_chainer_hook``).
The planning core (profile, simulator, policies, plan) is plain Python + NumPy/pandas.
"""
from pooch_ext import _moved
from pooch_ext._compat import ensure_chainer_importable

ensure_chainer_importable()
_moved.install()

__version__ = "0.1.0"

# The public API, imported on first use so that ``import pooch_ext`` stays light and the
# planning core never pulls in chainer: name -> the module that defines it.
_PUBLIC = {
    "PoocH": "pooch_ext.pooch",
    "classify": "pooch_ext.policies",
    "simulate": "pooch_ext.sim.engine",
    "minimum_budget": "pooch_ext.sim.budgets",
    "minimum_host_budget": "pooch_ext.sim.budgets",
    "Profile": "pooch_ext.profile",
    "Plan": "pooch_ext.plan",
    "errors": "pooch_ext.errors",
    # the errors a training loop may want to catch (all of them in pooch_ext.errors)
    "PoochError": "pooch_ext.errors",
    "BudgetTooSmallError": "pooch_ext.errors",
    "HostBudgetTooSmallError": "pooch_ext.errors",
    "PolicyDoesNotFitError": "pooch_ext.errors",
    "PolicyError": "pooch_ext.errors",
    "UnsupportedLoopError": "pooch_ext.errors",
    "RanksDisagreeError": "pooch_ext.errors",
    "DeviceOutOfMemoryError": "pooch_ext.errors",
    "SpentGraphError": "pooch_ext.errors",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        import importlib

        module = importlib.import_module(_PUBLIC[name])
        return module if module.__name__.endswith(f".{name}") else getattr(module, name)
    raise AttributeError(f"module 'pooch_ext' has no attribute {name!r}")
