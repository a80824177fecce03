"""Rules of the layout that a change can break without any behaviour test noticing: no import
cycles, a planning core (profiles, simulator, policies, plans) that never imports chainer, so
it runs, and is tested, where chainer cannot be installed, one home for errors, and modules
and functions short enough to read."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (("pooch_ext", "pooch_ext"), ("hooks", "pooch_ext.hooks"))
PLANNING_CORE = ["errors", "units", "links", "profile_check", "profile_format", "profile", "plan",
                 "builder", "trace",
                 "functions", "analytic", "analytic.shapes", "analytic.costmodel", "analytic.rescale",
                 "analytic.synthetic", "sim", "sim.model", "sim.check", "sim.engine",
                 "sim.batch", "sim.memory", "sim.budgets", "sim.timeline", "report",
                 "report.classtable", "exact",
                 "policies", "policies.search", "policies.common", "policies.pooch",
                 "policies.superneurons", "policies.sqrt_n", "policies.vdnn_common"]


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES:
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package] + parts)] = path
    return found


def _imports(path: Path, known: set[str], lazy: bool) -> set[str]:
    """Modules of ours that ``path`` imports: at module level, or anywhere with ``lazy``
    (imports inside functions); never those under ``if TYPE_CHECKING``. The top package's
    ``__init__`` (which every submodule import runs anyway) is not an edge."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.dump(child.test):
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and not lazy:
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.add(child.module)
                found.update(f"{child.module}.{alias.name}" for alias in child.names)
            visit(child)

    visit(ast.parse(path.read_text()))
    return {name for name in found if name in known and name != "pooch_ext"}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            strong(v)
    return cycles


def _graph(lazy: bool, only: set[str] | None = None) -> dict[str, set[str]]:
    modules = _modules()
    names = set(modules) if only is None else only
    return {name: _imports(modules[name], names, lazy) - {name} for name in names}


def test_no_import_cycles_at_module_level():
    assert _cycles(_graph(lazy=False)) == []


def test_the_planning_core_has_no_cycles_even_through_imports_inside_functions():
    core = {f"pooch_ext.{name}" for name in PLANNING_CORE}
    assert core <= set(_modules())
    assert _cycles(_graph(lazy=True, only=core)) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_planning_core_never_imports_chainer():
    from pooch_ext.policies import POLICIES

    names = [f"pooch_ext.{name}" for name in PLANNING_CORE] + list(POLICIES.values())
    code = (f"import sys\nfor name in {names!r}:\n    __import__(name)\n"
            "print(sorted(m for m in ('chainer', 'cupy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_moved_modules_stay_importable_under_their_old_names_for_one_release():
    """In a fresh interpreter (an old name imported earlier in this session warns no more)."""
    code = """
import importlib, warnings
from pooch_ext._moved import MOVED
for old, new in MOVED.items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(new), old
    assert module.__spec__.name == new, old
    assert any(w.category is DeprecationWarning and new in str(w.message) for w in caught), old
print("ok", len(MOVED))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.startswith("ok"), out.stderr


def test_the_public_api_is_importable_from_the_package():
    import pooch_ext
    from pooch_ext import PoocH, Plan, Profile, classify, minimum_budget, simulate  # noqa: F401
    from pooch_ext.plan import Plan as PlanItself

    assert Plan is PlanItself
    assert sorted(pooch_ext.__all__) == pooch_ext.__all__
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        pooch_ext.nothing  # noqa: B018  (the lookup is what is tested)


def test_every_error_a_user_catches_lives_in_pooch_ext_errors():
    """One home for exceptions; the runtime's stay importable where they were raised."""
    import inspect

    from pooch_ext import errors, pooch

    raised_by_pooch = {name for name, value in vars(pooch).items()
                       if inspect.isclass(value) and issubclass(value, Exception)}
    assert {"UnsupportedLoopError", "PolicyDoesNotFitError", "ExecutorError"} <= raised_by_pooch
    for name in raised_by_pooch:
        assert getattr(errors, name, None) is getattr(pooch, name), name


MODULE_LINES = 460     # "no module over about 400 lines"
FUNCTION_LINES = 65    # "no function over about 60 lines without a reason in a comment"


def test_no_module_is_much_over_400_lines():
    long = {str(path.relative_to(ROOT)): n for path in _modules().values()
            if (n := len(path.read_text().splitlines())) > MODULE_LINES}
    assert long == {}


def test_a_function_over_60_lines_says_why_in_a_comment():
    """A long function starts (after its docstring) with a comment saying it is long on
    purpose and why."""
    unexplained = []
    for path in _modules().values():
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    node.end_lineno - node.lineno + 1 > FUNCTION_LINES:
                head = "\n".join(lines[node.lineno - 1:node.body[0].end_lineno + 3])
                if "Long on purpose" not in head:
                    unexplained.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert unexplained == []


def test_an_installed_wheel_holds_every_package():
    """setup.py's packages are what a (non-editable) install copies: a package left out
    imports in the editable checkout and fails everywhere else (it did, on the GPU machine)."""
    import runpy
    from unittest import mock

    with mock.patch("setuptools.setup") as setup:
        runpy.run_path(str(ROOT / "setup.py"), run_name="setup")
    listed = set(setup.call_args.kwargs["packages"])
    present = {".".join(("pooch_ext", *p.parent.relative_to(ROOT / "pooch_ext").parts))
               for p in (ROOT / "pooch_ext").rglob("__init__.py")} | {"pooch_ext.hooks"}
    assert listed == present
