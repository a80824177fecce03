"""Every private part of Chainer that pooch-ext touches, in one place, checked against the
installed Chainer.

The runtime must drop and restore a feature map's array without Chainer noticing (no shape
checks, no new graph nodes), read what a function retained for backward, re-run a
BatchNormalization forward exactly, and snapshot and restore every bit of training state; the
public API offers none of that. Each accessor below says which private name it uses and why.
Nothing else in pooch_ext or its hooks may use these names (tests/test_chainer_refs.py reads
the sources to keep it so), and ``check_chainer`` refuses, before PoocH changes anything, a
Chainer other than the tested one or one where any of these names is missing.
"""
from __future__ import annotations

import functools
import importlib
import sys
import weakref
from types import MethodType, ModuleType
from typing import Any, Callable

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer

from pooch_ext.errors import PoochError

TESTED_CHAINER = "7.8.1"

# a function's array core after forward_cpu / forward_gpu's checks: for NumPy, for CuPy
_COMPUTE_CORES = ("_forward_cpu_core", "_forward_gpu_core")
_SPLIT_FUNCTIONS = (("chainer.functions.connection.convolution_2d", "Convolution2DFunction"),
                    ("chainer.functions.connection.convolution_2d", "Convolution2DGradW"),
                    ("chainer.functions.connection.deconvolution_2d", "Deconvolution2DFunction"))
# the N-D functions' array core for both: ``_forward_xp(*arrays, xp)``
_ND_CORE = "_forward_xp"
_SPLIT_ND_FUNCTIONS = (("chainer.functions.connection.convolution_nd", "ConvolutionND"),
                       ("chainer.functions.connection.convolution_nd", "ConvolutionNDGradW"),
                       ("chainer.functions.connection.deconvolution_nd", "DeconvolutionND"))

# (module, class or None, private name): everything the accessors below use
PRIVATE_NAMES: tuple[tuple[str, str | None, str], ...] = (
    ("chainer.variable", "VariableNode", "_data"),
    ("chainer.variable", "Variable", "_data"),
    ("chainer.variable", "Variable", "_grad_valid"),
    ("chainer.variable", "Variable", "_set_grad_without_check"),
    ("chainer.function_node", "FunctionNode", "_retained_output_data"),
    ("chainer.function_node", "FunctionNode", "_input_indexes_to_retain"),
    ("chainer.function_node", "FunctionNode", "_output_indexes_to_retain"),
    ("chainer.link", "Link", "_persistent"),
    ("chainer.optimizer", "UpdateRule", "_state"),
    ("chainer.optimizer", "UpdateRule", "_fp32_param"),
    # ``_impl`` itself is set by forward; the selector that sets it stands for it here
    ("chainer.functions.normalization.batch_normalization", "BatchNormalization",
     "_impl_selector"),
    ("chainer.functions.normalization.batch_normalization", None,
     "GeneralBatchNormalizationImpl"),
    ("chainer.functions.normalization.batch_normalization", None, "_apply_bn_fwd"),
    ("chainer._backprop", None, "_backprop_to_all"),
    ("chainer.function_node", None, "_backprop"),    # chainer.grad's loop (hooks_in_data)
    ("chainer.function_node", "FunctionNode", "_local_function_hooks"),
    # the im2col / GEMM cores of a convolution and of its backward's two functions
    *((module, cls, core) for module, cls in _SPLIT_FUNCTIONS for core in _COMPUTE_CORES),
    *((module, cls, _ND_CORE) for module, cls in _SPLIT_ND_FUNCTIONS),
    ("chainer", None, "_get_link_hooks"),
    # what a deconvolution's forward sets before its core runs (split exactness keys)
    ("chainer.functions.connection.deconvolution_2d", "Deconvolution2DFunction",
     "_calc_out_size"),
    ("chainer.functions.connection.deconvolution_2d", "Deconvolution2DFunction",
     "_set_cover_all"),
)


class ChainerVersionError(PoochError):
    """The installed Chainer is not the one pooch-ext's runtime was tested against."""


# ---------------------------------------------------------------- the check

@functools.lru_cache(maxsize=1)
def check_chainer() -> None:
    """Refuse (ChainerVersionError) a Chainer other than TESTED_CHAINER, or one lacking any
    private name in PRIVATE_NAMES; run once per process (cached)."""
    problems = []
    if chainer.__version__ != TESTED_CHAINER:
        problems.append(f"chainer {chainer.__version__} is installed, pooch-ext's runtime is "
                        f"tested with chainer {TESTED_CHAINER}")
    missing = [_dotted(module, owner, name) for module, owner, name in PRIVATE_NAMES
               if not _has(module, owner, name)]
    if missing:
        problems.append(f"private names it relies on are missing: {', '.join(missing)}")
    if problems:
        raise ChainerVersionError("; ".join(problems) + f" (pip install chainer=={TESTED_CHAINER})")


def _dotted(module: str, owner: str | None, name: str) -> str:
    return ".".join(part for part in (module, owner, name) if part)


def _has(module: str, owner: str | None, name: str) -> bool:
    """Whether the name exists: on the module, or on the class (attributes set only in
    ``__init__`` are looked for on a tiny instance)."""
    try:
        where: Any = importlib.import_module(module)
        if owner is not None:
            where = getattr(where, owner)
    except (ImportError, AttributeError):
        return False
    if hasattr(where, name) or owner is None:
        return hasattr(where, name)
    instance = _tiny_instance(module, owner)
    return instance is not None and hasattr(instance, name)


def _tiny_instance(module: str, owner: str) -> Any:
    """An instance of the few classes whose private attributes live on instances only."""
    import numpy as np

    if owner == "Variable":
        return chainer.Variable(np.zeros(1, np.float32))
    if owner == "VariableNode":
        return chainer.Variable(np.zeros(1, np.float32)).node
    if owner == "FunctionNode":
        return chainer.FunctionNode()
    if owner == "Link":
        return chainer.Link()
    if owner == "UpdateRule":
        return chainer.optimizer.UpdateRule()
    if owner == "BatchNormalization":
        from chainer.functions.normalization.batch_normalization import BatchNormalization
        return BatchNormalization()
    return None


# ---------------------------------------------------------------- graph arrays

def node_array(node: Any) -> Any:
    """The array a VariableNode holds (``_data``): the public ``data`` property of a node is
    the same, but dropping must not go through its setter (below)."""
    return node._data


def set_node_array(node: Any, array: Any) -> None:
    """Drop (None) or restore a VariableNode's array via ``_data``, bypassing the ``data``
    setter, which would also reset the node's shape and dtype that backward still reads."""
    node._data = array


def variable_array(variable: Any) -> Any:
    """The array of a Variable (``_data[0]``) without the ``array`` property's device checks
    and without creating anything."""
    return variable._data[0]


def retained_outputs(function: Any) -> tuple | None:
    """The outputs a FunctionNode retained for its backward (``_retained_output_data``):
    where a swapped or recomputed output lives besides its node."""
    return function._retained_output_data


def set_retained_outputs(function: Any, data: tuple) -> None:
    """Drop or restore retained outputs (Chainer offers no setter)."""
    function._retained_output_data = data


def retained_indexes(function: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Which inputs and outputs a FunctionNode retained (``_input_indexes_to_retain``,
    ``_output_indexes_to_retain``): what its backward will need, as Chainer decided it."""
    return (tuple(function._input_indexes_to_retain or ()),
            tuple(function._output_indexes_to_retain or ()))


# ---------------------------------------------------------------- training state

def persistent_names(link: Any) -> set[str]:
    """Names of a link's persistent values (``_persistent``: BatchNormalization's running
    statistics, counters), the training state besides parameters and optimizer state."""
    return link._persistent


def optimizer_state(rule: Any) -> dict | None:
    """An update rule's state (``_state``: momentum, Adam moments), None before the first
    update creates it; the public ``state`` property exists only from then on."""
    return getattr(rule, "_state", None)


def set_optimizer_state(rule: Any, state: dict | None) -> None:
    """Give an update rule a state (a throwaway copy a fresh one, to measure what
    ``init_state`` allocates; a refused run's rules their state as it was)."""
    rule._state = state


def fp32_master(rule: Any) -> Any:
    """The float32 copy an update rule keeps of a float16 parameter (``_fp32_param``, made at
    its first update with ``use_fp32_update``): the weights the update really changes."""
    return rule._fp32_param


def set_fp32_master(rule: Any, master: Any) -> None:
    rule._fp32_param = master


def grad_valid(param: Any) -> bool:
    """Whether a Parameter's gradient counts (``_grad_valid``: cleargrads leaves a None that
    ``grad`` refuses to read); saved with a snapshot so a restore leaves it as it was."""
    return param._grad_valid


def set_grad_valid(param: Any, valid: bool) -> None:
    param._grad_valid = valid


def set_grad_unchecked(param: Any, grad: Any) -> None:
    """Put a gradient back as it was, past the setter's dtype check: a parameter whose
    array was cast by hand keeps a gradient of the old dtype, which ``grad =`` refuses."""
    param._set_grad_without_check(grad)


def link_hooks() -> dict:
    """The thread's table of link hooks (``chainer._get_link_hooks``; only function hooks have
    a public getter): PoocH takes its own hooks out of it for a while."""
    return chainer._get_link_hooks()


# ---------------------------------------------------------------- recomputation

def batch_norm_impl(function: Any) -> Any:
    """The implementation a BatchNormalization node used (``_impl``): only the general one
    can be recomputed bit for bit."""
    return getattr(function, "_impl", None)


def apply_batch_norm_forward(xp: ModuleType, x: Any, mean: Any, inv_std: Any, gamma: Any,
                             beta: Any) -> Any:
    """Chainer's own BatchNormalization forward arithmetic (``_apply_bn_fwd``), so a
    recomputed output equals the original bit for bit."""
    from chainer.functions.normalization import batch_normalization as bn

    return bn._apply_bn_fwd(xp, x, mean, inv_std, gamma, beta)


# ---------------------------------------------------------------- backward passes

def backprop_patch_point() -> tuple[ModuleType, str]:
    """Where every ``backward()`` goes through (``chainer._backprop._backprop_to_all``): the
    module and name GraphRecorder wraps to learn when a backward pass starts and ends."""
    import chainer._backprop as backprop

    return backprop, "_backprop_to_all"


def wrap_backprop(wrap: Callable[[Callable], Callable]) -> Callable:
    """Replace ``_backprop_to_all`` by ``wrap(original)``; returns the original."""
    owner, name = backprop_patch_point()
    original = getattr(owner, name)
    setattr(owner, name, wrap(original))
    return original


# Chainer's backward loops (``backward()``'s and ``chainer.grad``'s): module, function; each
# reads its inputs' arrays into the local list ``in_data`` for ``func`` before any hook runs
BACKWARD_LOOPS = (("chainer._backprop", "_backprop_to_all"), ("chainer.function_node", "_backprop"))


def has_other_hooks(function: Any) -> bool:
    """Whether a function hook besides PoocH's (one, global) sees ``function``'s backward:
    another global one, or one of the node's own (read without making its table)."""
    return len(chainer.get_function_hooks()) > 1 or bool(function._local_function_hooks)


def hooks_in_data(function: Any) -> list | None:
    """The list Chainer's backward loop hands every hook of ``function`` as ``in_data`` (a
    tuple made from it for each hook in turn), found in the loop's frame; None where
    ``function`` is not the node that loop is at. Read before any hook runs: a map PoocH
    brings back in its hook is None there, so the hooks after PoocH's see it only once
    this list has it too."""
    frame = sys._getframe(1)
    while frame is not None:
        if (frame.f_globals.get("__name__"), frame.f_code.co_name) in BACKWARD_LOOPS:
            local = frame.f_locals
            found = local.get("in_data")
            return found if local.get("func") is function and isinstance(found, list) else None
        frame = frame.f_back
    return None


class WeaklyBound:
    """``method`` bound to ``owner`` through a weak reference, for storing on ``owner``
    itself: a bound method there would be a reference cycle, so the node and every array it
    retains would live until Python's cycle collector ran (measured: a 1.5 MB gradient held
    past its last use at random ops, over a tight budget)."""

    __slots__ = ("method", "owner")

    def __init__(self, method: Callable, owner: Any) -> None:
        self.method = method
        self.owner = weakref.ref(owner)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        owner = self.owner()
        if owner is None:
            raise ReferenceError("the function node this method was bound to is gone")
        return self.method(owner, *args, **kwargs)


def set_compute_core(function: Any, core: Callable) -> None:
    """Replace, on this one function node, the core its forward calls after its checks
    (2D: ``_forward_cpu_core`` / ``_forward_gpu_core``; N-D: ``_forward_xp``, whose last
    argument, the array module, ``core`` does not get): im2col + GEMM for a convolution, GEMM
    + col2im for a deconvolution; hooks/split_conv*.py run it in pieces.
    ``core(function, *arrays)`` gets the node as its first argument."""
    if hasattr(type(function), _ND_CORE):
        setattr(function, _ND_CORE, WeaklyBound(_without_xp(core), function))
        return
    bound = WeaklyBound(core, function)
    for name in _COMPUTE_CORES:
        setattr(function, name, bound)


def _without_xp(core: Callable) -> Callable:
    def called(function: Any, *arrays_and_xp: Any) -> Any:
        return core(function, *arrays_and_xp[:-1])
    return called


def original_compute_core(function: Any, xp: ModuleType) -> Callable:
    """The class's own core of ``function`` for arrays of ``xp`` (NumPy or CuPy), bound to
    it and called with the arrays only: what runs where a split is not exact."""
    cls = type(function)
    if hasattr(cls, _ND_CORE):
        return functools.partial(getattr(cls, _ND_CORE), function, xp=xp)
    cpu, gpu = _COMPUTE_CORES
    return MethodType(getattr(cls, cpu if xp.__name__ == "numpy" else gpu), function)


def deconvolution_as_its_forward_sets(node: Any, x_shape: tuple, w_shape: tuple,
                                      gpu: bool) -> None:
    """Give a Deconvolution2DFunction that has not run the attributes its forward sets before
    the core: the output size, and on a GPU ``cover_all`` (forward_gpu sets it there,
    forward_cpu only in backward). A split's exactness check is keyed by them: measured
    without ``cover_all``, every planned input gradient on the GPU probed inside the op."""
    node._calc_out_size(x_shape, w_shape)
    if gpu:
        node._set_cover_all(x_shape, w_shape)
