"""pooch-ext: profiling-based out-of-core hybrid training (PoocH) for Chainer 7.

Importing this package makes chainer work on NumPy 2 (see ``_compat``); installed, pooch-ext
does that for ``import chainer`` alone too (``_pooch_ext_chainer_hook``).
The planning core (profile, simulator, policies, plan) is plain Python + NumPy/pandas.
"""
from pooch_ext._compat import ensure_chainer_importable

ensure_chainer_importable()

__version__ = "0.1.0"


def __getattr__(name: str):
    """``pooch_ext.PoocH`` without importing chainer until it is used."""
    if name == "PoocH":
        from pooch_ext.pooch import PoocH
        return PoocH
    raise AttributeError(f"module 'pooch_ext' has no attribute {name!r}")
