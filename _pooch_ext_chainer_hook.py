"""Make ``import chainer`` work on NumPy 2 in any order, without importing anything at start-up.

pooch-ext installs ``pooch_ext_chainer.pth`` next to this module in site-packages (setup.py);
its one line calls ``install()`` when the interpreter starts. That only puts ``ChainerFinder``
at the front of ``sys.meta_path``: numpy, chainer and pooch_ext are not imported. The first
time a module named ``chainer`` or ``chainer.*`` is imported, the finder hands it to
``pooch_ext._compat``, which applies its patches around exactly those chainer modules that
need them. ``import pooch_ext`` installs the finder too (a checkout run without installing).
"""
import sys


class ChainerFinder:
    """A meta-path finder that lets ``pooch_ext._compat`` see chainer's modules being found."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if fullname != "chainer" and not fullname.startswith("chainer."):
            return None   # every other import: one string check
        try:
            from pooch_ext._compat import find_chainer_spec
        except ImportError:   # no pooch_ext, or another version of it first on sys.path
            return None
        return find_chainer_spec(fullname, path, target, ChainerFinder)


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if ChainerFinder not in sys.meta_path:
        sys.meta_path.insert(0, ChainerFinder)
