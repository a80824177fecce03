"""hooks/chainer_refs.py: the one home of every private Chainer name, and its version check."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer

from pooch_ext.hooks import chainer_refs
from pooch_ext.hooks.chainer_refs import PRIVATE_NAMES, ChainerVersionError, check_chainer
from pooch_ext.testing import BranchyNet

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh_check():
    """check_chainer caches its verdict per process: clear it around a test that changes
    what it sees."""
    check_chainer.cache_clear()
    yield
    check_chainer.cache_clear()


def test_the_installed_chainer_passes_the_check(fresh_check):
    assert chainer.__version__ == chainer_refs.TESTED_CHAINER
    check_chainer()


def test_another_chainer_version_is_refused_by_name(fresh_check, monkeypatch):
    monkeypatch.setattr(chainer, "__version__", "8.0.0")
    with pytest.raises(ChainerVersionError, match=r"chainer 8\.0\.0 is installed.*7\.8\.1"):
        check_chainer()


def test_a_missing_private_name_is_refused_by_name(fresh_check, monkeypatch):
    import chainer._backprop as backprop

    monkeypatch.delattr(backprop, "_backprop_to_all")
    with pytest.raises(ChainerVersionError, match=r"missing: chainer\._backprop\._backprop_to_all"):
        check_chainer()


def test_pooch_refuses_an_untested_chainer_before_touching_the_model(fresh_check, monkeypatch):
    from pooch_ext.pooch import PoocH

    monkeypatch.setattr(chainer, "__version__", "7.0.0")
    model = BranchyNet()
    with pytest.raises(ChainerVersionError):
        PoocH(model, profile_iters=1)
    assert not chainer.get_function_hooks()        # nothing installed


def _private_names() -> set[str]:
    return {name for _, _, name in PRIVATE_NAMES if name.startswith("_")} | {"_impl"}


def test_no_other_module_touches_chainers_private_names():
    """Attribute access (``x._data``) or getattr/setattr with the name as a string: only
    chainer_refs.py may do either, for the names it lists."""
    names = _private_names()
    offenders = []
    files = list((ROOT / "hooks").glob("*.py")) + list((ROOT / "pooch_ext").rglob("*.py"))
    for path in files:
        if path.name == "chainer_refs.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in names:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.Constant) and node.value in names:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert offenders == []


def test_the_source_scan_would_see_a_private_access(tmp_path):
    tree = ast.parse("def f(node):\n    return node._data\n")
    found = [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)]
    assert found == ["_data"] and "_data" in _private_names()
