"""Let chainer 7.8.1 import and run on today's Python / NumPy, patching no more than it must.

chainer 7.8.1 (2020) trips over three things; each patch concerns one chainer module, and
numpy itself is left as it is:

* ``chainer._environment_check`` imports ``numpy.distutils`` (removed in NumPy 2 and on
  Python >= 3.12) and ``pkg_resources`` (removed in setuptools 81) only to warn about macOS
  BLAS and optional-package versions. A silent stand-in for that module is registered before
  chainer imports it.
* ``chainer.functions.array.as_strided`` reads ``np.sctypes`` (removed in NumPy 2) when it is
  imported and in ``AsStridedGrad.forward`` (its backward). While that module executes,
  ``numpy.sctypes`` exists (NumPy 1.26's table) and is removed again afterwards.
* ``chainer.functions.array.resize_images.compute_indices_and_weights`` (``F.resize_images``)
  reads ``numpy.float`` (removed in NumPy 1.24; it was Python's ``float``).

Each function named above is replaced by a copy of itself (same code) whose global name for
numpy is a view of numpy with the removed name restored; the rest of the module, identity
checks such as ``xp is numpy`` included, sees numpy itself. The patches are applied when
chainer is imported, whatever the order: ``_pooch_ext_chainer_hook`` (installed with a ``.pth``
file, and by ``import pooch_ext``) hands chainer's modules to ``find_chainer_spec``.
Nothing else in chainer is touched.
"""
from __future__ import annotations

import functools
import sys
import types
from typing import Any, Callable

import _pooch_ext_chainer_hook

ENVIRONMENT_CHECK = "chainer._environment_check"
PATCHED = "__pooch_ext_patched__"   # set on a chainer module once its functions are replaced


def _sctypes(np: Any) -> dict:
    """NumPy 1.26's ``np.sctypes`` table."""
    return {
        "int": [np.int8, np.int16, np.int32, np.int64],
        "uint": [np.uint8, np.uint16, np.uint32, np.uint64],
        "float": [np.float16, np.float32, np.float64, np.longdouble],
        "complex": [np.complex64, np.complex128, np.clongdouble],
        "others": [bool, object, bytes, str, np.void],
    }


# chainer module -> its name for numpy, the removed name it reads, that name's old value (from
# numpy), and the functions that read it when called
WANTED: dict[str, tuple[str, str, Callable[[Any], Any], tuple[str, ...]]] = {
    "chainer.functions.array.as_strided": ("np", "sctypes", _sctypes, ("AsStridedGrad.forward",)),
    "chainer.functions.array.resize_images": ("numpy", "float", lambda _: float,
                                              ("compute_indices_and_weights",)),
}


def patch_for(module: str) -> dict[str, Any] | None:
    """How to patch chainer ``module`` on this numpy; None if it needs nothing."""
    import numpy

    if module not in WANTED:
        return None
    alias, name, old_value, functions = WANTED[module]
    if hasattr(numpy, name):
        return None
    return {"alias": alias, "names": {name: old_value(numpy)}, "functions": functions}


def numpy_view(names: dict[str, Any]) -> types.ModuleType:
    """numpy plus ``names``: what a patched function sees as numpy."""
    import numpy

    view = types.ModuleType("numpy", f"numpy, plus {', '.join(sorted(names))} "
                                     "restored for chainer 7.8.1 (pooch_ext._compat)")
    view.__dict__.update(names)
    view.__getattr__ = lambda name: getattr(numpy, name)   # PEP 562: everything else
    return view


def patch_module(module: types.ModuleType, patch: dict[str, Any]) -> None:
    """Replace each of ``patch["functions"]`` by a copy that sees a numpy view as numpy."""
    scope = {**vars(module), patch["alias"]: numpy_view(patch["names"])}
    for path in patch["functions"]:
        *parents, name = path.split(".")
        owner = module
        for part in parents:
            owner = getattr(owner, part)
        original = getattr(owner, name)
        copy = types.FunctionType(original.__code__, scope, original.__name__,
                                  original.__defaults__, original.__closure__)
        copy.__kwdefaults__ = original.__kwdefaults__
        functools.update_wrapper(copy, original)
        setattr(owner, name, copy)
    setattr(module, PATCHED, sorted(patch["names"]))


class _PatchingLoader:
    """Runs a chainer module with its own loader, the removed names present in numpy
    meanwhile, then patches its functions; every other loader attribute is the original's."""

    def __init__(self, loader: Any, patch: dict[str, Any]) -> None:
        self._loader, self._patch = loader, patch

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        import numpy

        names = self._patch["names"]
        added = [name for name in names if name not in vars(numpy)]
        for name in added:
            setattr(numpy, name, names[name])
        try:
            self._loader.exec_module(module)
        finally:
            for name in added:
                delattr(numpy, name)
        patch_module(module, self._patch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def _silent_environment_check() -> types.ModuleType:
    module = types.ModuleType(ENVIRONMENT_CHECK)
    module.__doc__ = ("Stand-in from pooch_ext._compat: the original imports numpy.distutils "
                      "and pkg_resources only to print warnings.")
    module.check = lambda: None  # type: ignore[attr-defined]
    return module


def find_chainer_spec(fullname: str, path: Any, target: Any, finder: Any) -> Any:
    """What ``_pooch_ext_chainer_hook.ChainerFinder`` answers for chainer's modules: nothing
    (after registering the stand-in, for ``chainer`` itself), or a patched module's spec."""
    if fullname == "chainer":
        sys.modules.setdefault(ENVIRONMENT_CHECK, _silent_environment_check())
        return None
    patch = patch_for(fullname)
    if patch is None:
        return None
    spec = _spec_from_others(fullname, path, target, finder)
    if spec is not None and spec.loader is not None:
        spec.loader = _PatchingLoader(spec.loader, patch)
    return spec


def _spec_from_others(fullname: str, path: Any, target: Any, finder: Any) -> Any:
    """The spec the rest of ``sys.meta_path`` finds (importlib.util.find_spec would ask us)."""
    for other in sys.meta_path:
        find: Callable | None = getattr(other, "find_spec", None)
        if other is finder or find is None:
            continue
        spec = find(fullname, path, target)
        if spec is not None:
            return spec
    return None


def ensure_chainer_importable() -> None:
    """Install the finder (``import pooch_ext`` does); patch modules chainer already loaded."""
    _pooch_ext_chainer_hook.install()
    if "chainer" not in sys.modules:
        sys.modules.setdefault(ENVIRONMENT_CHECK, _silent_environment_check())
    for name in WANTED:
        module, patch = sys.modules.get(name), patch_for(name)
        if module is not None and patch is not None and not hasattr(module, PATCHED):
            patch_module(module, patch)
