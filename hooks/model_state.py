"""The training state a model holds, as the runtime must see it: every array training changes
(parameters, gradients, persistent values, optimizer state), host copies of it, and the bytes
that stay resident on the device whatever the plan. Used to account the device's memory, to
snapshot and restore a model when PoocH refuses before an update (ModelSnapshot), and by
the tests that compare PoocH with plain Chainer bit for bit.
"""
from __future__ import annotations

import copy
import weakref
from typing import Any, Callable, Iterator

import numpy as np

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer

from pooch_ext.hooks.chainer_refs import (fp32_master, grad_valid, optimizer_state,
                                          persistent_names, set_fp32_master, set_grad_unchecked,
                                          set_grad_valid, set_optimizer_state)


def base_of(array: Any) -> Any:
    """The array that owns the memory ``array`` views (itself when it owns it)."""
    while isinstance(getattr(array, "base", None), type(array)):
        array = array.base
    return array


def is_array(value: Any) -> bool:
    """A NumPy or CuPy array (not a NumPy scalar, nor a type such as the np.float64 F.cast
    keeps): something that holds a buffer."""
    return (hasattr(value, "nbytes") and hasattr(value, "shape") and hasattr(value, "dtype")
            and not isinstance(value, (np.generic, type)))


def grad_of(param: Any) -> Any:
    """``param.grad`` (set by backward or by hand), or None where cleargrads left none."""
    try:
        return param.grad
    except RuntimeError:      # cleared by cleargrads() and not yet set by backward
        return None


def persistent_values(model: Any) -> Iterator[tuple[str, Any, str, Any]]:
    """``(link path, link, name, value)`` of every persistent value of the model's links
    (BatchNormalization running statistics, counters): the state training changes besides the
    parameters and the optimizer's. Names in sorted order, so every process sees one order."""
    for path, link in model.namedlinks():
        for name in sorted(persistent_names(link)):
            yield path, link, name, link.__dict__[name]


def model_arrays_with(model: Any) -> Iterator[Any]:
    """Every array a model owns: parameters, gradients, persistent state, optimizer state."""
    for param in model.params():
        for array in (param.array, grad_of(param)):
            if array is not None:
                yield array
        rule = getattr(param, "update_rule", None)
        for value in (optimizer_state(rule) or {}).values():
            if is_array(value):
                yield value
    for _, _, _, value in persistent_values(model):
        if is_array(value):
            yield value


def model_arrays(model: Any) -> set[int]:
    """ids of the buffers a model owns (parameters, gradients, persistent and optimizer state)."""
    return {id(base_of(array)) for array in model_arrays_with(model)}


def made_apart(param: Any, apart: Callable[[], Any]) -> None:
    """``param``'s making (a lazily made link's first call) runs in ``apart()`` (the CPU
    device's counter: counted, then taken out of the peak): NumPy initializers draw float64
    values and cast them, a temporary of twice the weight's bytes that a GPU holds on the
    host, and that had counted as what the first iteration's op held (a user's net with a
    655 KB ``L.Linear(None, 10)`` was refused below 1.8 times what later iterations need).
    The parameter itself stays counted. Once per parameter: a link first called several
    iterations on is found lazy at each iteration's start."""
    if "initialize" in vars(param):
        return
    initialize = param.initialize

    def once(shape: Any) -> None:
        not_apart(param)
        with apart():
            initialize(shape)
    param.initialize = once


def not_apart(param: Any) -> None:
    """``param`` makes itself as Chainer does again (made, or PoocH ended before)."""
    vars(param).pop("initialize", None)


def host_copy(array: Any) -> Any:
    """A NumPy copy of a NumPy or CuPy array, never an alias of it (None stays None)."""
    if array is None:
        return None
    return np.array(chainer.backend.CpuDevice().send(array), copy=True)


def optimizer_state_bytes(param: Any) -> int:
    """Bytes of the optimizer state of ``param``: what its update rule holds, or, before the
    first update creates it, what ``init_state`` will allocate (run on a throwaway copy of
    the rule, for a host stand-in of the parameter: run on the device, the throwaway state
    was device memory before the first op, which the first check counted as what the loop
    ran there: a user's MLP with Adam was refused at 1.32 times what later iterations hold).
    A rule the stand-in does not suit is run for the parameter itself. A disabled rule
    (``link.disable_update()``: a frozen backbone) makes none: only what it holds counts
    (counted, a fine-tuning MLP with Adam was refused at twice what it holds)."""
    rule = getattr(param, "update_rule", None)
    if rule is None or param.array is None:
        return 0
    state = optimizer_state(rule)
    if not state and rule.enabled:
        probe = copy.copy(rule)
        try:
            set_optimizer_state(probe, {})
            stand_in = chainer.Parameter(np.zeros(param.array.shape, param.array.dtype))
            with chainer.using_device("@numpy"):
                probe.init_state(stand_in)
        except Exception:     # a rule of the user's that reads more than the array
            set_optimizer_state(probe, {})
            with chainer.using_device(chainer.backend.get_device_from_array(param.array)):
                probe.init_state(param)
        state = optimizer_state(probe)
    return sum(int(v.nbytes) for v in (state or {}).values() if is_array(v))


def resident_bytes(model: Any) -> int:
    """Bytes no policy moves: parameters, their gradients (present or about to be), persistent
    state (BatchNormalization running statistics) and optimizer state (present or about to be).
    Each array once: a ``model.copy()`` run in the block shares the model's arrays (counted
    again, Chainer's PTB example, whose evaluation runs such a copy, went 22% over)."""
    total = 0
    seen: set[int] = set()
    for param in model.params():
        if param.array is not None:
            if id(param.array) in seen:
                continue
            seen.add(id(param.array))
            total += 2 * int(param.array.nbytes)
        total += optimizer_state_bytes(param)
    for _, _, _, value in persistent_values(model):
        if is_array(value) and id(value) not in seen:
            seen.add(id(value))
            total += int(value.nbytes)
    return total


class ModelSnapshot:
    """Host copies of what a failed PoocH attempt could change in the model: parameters, their
    gradients (Chainer may write into a gradient array it reuses), persistent values
    (BatchNormalization running statistics) and the optimizers' steps and state."""

    def __init__(self, model: Any) -> None:
        self.params: list = []
        self.persistent: list = []
        self.optimizers: list = []       # (optimizer, t, epoch, [(rule, t, state, fp32)])
        self._seen: set = set()          # ids of parameters, (link id, name) of values
        self.add(model)

    def add(self, model: Any, held: bool = True) -> None:
        """Also snapshot ``model`` (a link that joined: taken before it first runs; not
        ``held``: a copy the loop lets go is not kept on the device for it, nor put back);
        what is already in the snapshot stays as it was taken."""
        keep: Callable[[Any], Any] = (lambda x: x) if held else weakref.ref
        for p in model.params():
            if id(p) not in self._seen:
                self._seen.add(id(p))
                self.params.append((keep(p), host_copy(p.array),
                                    (grad_valid(p), host_copy(grad_of(p)))))
        for _, link, name, value in persistent_values(model):
            if (id(link), name) not in self._seen:
                self._seen.add((id(link), name))
                self.persistent.append((keep(link), name, host_copy(value)
                                        if hasattr(value, "shape") else value))

    @staticmethod
    def _put(current: Any, saved: Any) -> Any:
        """``saved`` back into ``current`` in place when possible, else on its device."""
        if current is None or saved is None or not hasattr(current, "shape") or \
                current.shape != saved.shape:
            return saved if current is None or saved is None else \
                chainer.backend.get_device_from_array(current).send(saved)
        current[...] = chainer.backend.get_device_from_array(current).send(saved)
        return current

    def add_optimizer(self, optimizer: Any) -> None:
        """Also snapshot ``optimizer`` (taken at its first update under PoocH, before it
        changes anything): its step counts and each update rule's state, so a refusal made
        after updates within the first iteration can put them back too."""
        if id(optimizer) in self._seen:
            return
        self._seen.add(id(optimizer))
        def saved(state: dict | None) -> dict | None:
            return None if state is None else {
                k: host_copy(v) if hasattr(v, "shape") else v for k, v in state.items()}
        rules = [(rule, rule.t, saved(optimizer_state(rule)),
                  None if (master := fp32_master(rule)) is None else host_copy(master.array))
                 for rule in (p.update_rule for p in optimizer.target.params())
                 if rule is not None]
        self.optimizers.append((optimizer, optimizer.t, optimizer.epoch, rules))

    def restore(self) -> None:
        """Put the snapshot back into the model (arrays in place where the shapes agree), the
        earliest taken last: a link that joined later (``model.copy()``) may share arrays
        whose values it was snapshotted with after an update (put back first, a refusal had
        left a user's model as after its first update)."""
        for optimizer, t, epoch, rules in self.optimizers:
            optimizer.t, optimizer.epoch = t, epoch
            for rule, rule_t, state, master in rules:
                rule.t, current = rule_t, optimizer_state(rule) or {}
                set_optimizer_state(rule, None if state is None else {
                    k: self._put(current.get(k), v) if hasattr(v, "shape") else v
                    for k, v in state.items()})
                if master is None or fp32_master(rule) is None:
                    set_fp32_master(rule, None)     # made again from the parameter
                else:
                    fp32_master(rule).array = self._put(fp32_master(rule).array, master)
        for kept, array, (valid, grad) in reversed(self.params):
            if (param := _alive(kept)) is None:
                continue
            # a lazily initialised parameter the failed attempt initialised goes back to None
            param.array = None if array is None else self._put(param.array, array)
            if grad is None or param.array is None:
                param.grad = None
            else:   # unchecked: a hand-cast array's gradient keeps its old dtype
                set_grad_unchecked(param, chainer.backend.get_device_from_array(
                    param.array).send(grad))
            set_grad_valid(param, valid)
        for kept, name, value in reversed(self.persistent):
            if (link := _alive(kept)) is None:
                continue
            current = link.__dict__[name]
            link.__dict__[name] = self._put(current, value) if hasattr(value, "shape") else value


def _alive(kept: Any) -> Any:
    """What a snapshot entry refers to (None: a link that joined and is gone)."""
    return kept() if isinstance(kept, weakref.ref) else kept
