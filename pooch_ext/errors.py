"""Exceptions users can catch; the CLI prints their message as a one-line error."""
from __future__ import annotations

import numbers
from typing import Any, Iterable

from pooch_ext.units import format_bytes


class PoochError(Exception):
    """Base class: a problem with the user's input or setup, not a bug."""


class ProfileError(PoochError):
    """A profile folder is missing, malformed or inconsistent (names the file and field)."""


class UnknownNameError(PoochError, KeyError):
    """An unknown model / GPU / link / policy name; the message lists the known ones."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def check_name(name: object, known: Iterable[str], what: str) -> None:
    """Raise UnknownNameError("unknown <what> 'name'; known: a, b, ...") unless ``name`` is known."""
    known = list(known)
    if name not in known:
        raise UnknownNameError(f"unknown {what} {name!r}; known: {', '.join(known)}")


def check_count(name: str, value: object) -> int:
    """``value`` as a whole number >= 1, else ValueError naming ``name`` (a bool, a fraction or
    a string is refused, not rounded)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    return int(value)


def check_flag(name: str, value: object) -> bool:
    """``value`` when it is a bool, else ValueError (``split_convolutions="no"`` was taken
    as true)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


class BudgetTooSmallError(PoochError):
    """No plan can run the iteration within the budget; carries the smallest budget that works."""

    def __init__(self, budget_bytes: int, minimum_bytes: int, what: str = "") -> None:
        self.budget_bytes = int(budget_bytes)
        self.minimum_bytes = int(minimum_bytes)
        where = f" for {what}" if what else ""
        super().__init__(
            f"budget {_apart(budget_bytes, minimum_bytes)} is below the minimum any plan can "
            f"reach{where}: {format_bytes(minimum_bytes)} ({minimum_bytes} bytes)"
        )


def _apart(nbytes: int, minimum: int) -> str:
    """``nbytes`` as people read it, with its bytes where that reads the same as ``minimum``
    ('budget 4.01 KiB is below the minimum ...: 4.01 KiB' said nothing)."""
    shown = format_bytes(nbytes)
    return shown + (f" ({int(nbytes)} bytes)" if shown == format_bytes(minimum) else "")


class HostBudgetTooSmallError(BudgetTooSmallError):
    """No plan within the device budget keeps its swapped maps within the host budget;
    ``budget_bytes`` is the host budget, ``minimum_bytes`` the least host memory a plan
    needs at ``device_budget_bytes``."""

    def __init__(self, host_budget_bytes: int, minimum_bytes: int, device_budget_bytes: int,
                 what: str = "") -> None:
        super().__init__(host_budget_bytes, minimum_bytes, what)
        self.device_budget_bytes = int(device_budget_bytes)
        where = f" for {what}" if what else ""
        self.args = (f"host budget {_apart(host_budget_bytes, minimum_bytes)} is below the least host "
                     f"memory a plan within the device budget {format_bytes(device_budget_bytes)} "
                     f"needs{where}: {format_bytes(minimum_bytes)} ({minimum_bytes} bytes)",)


class GraphChangedError(PoochError):
    """The training graph differs from the profiled one (ops or shapes); a plan cannot apply."""


class ExecutorError(PoochError):
    """The schedule and the running graph disagree in a way the executor cannot repair."""


class UnsupportedLoopError(PoochError):
    """The training loop does something PoocH cannot run exactly (double backprop, a static
    graph); raised before any update, with the models as they were."""


class SpentGraphError(PoochError):
    """``backward()`` reached a node of an iteration that has ended, whose saved arrays PoocH
    freed at that iteration's backward (as a plan frees every map after its last use);
    Chainer would fail there with an AttributeError deep inside the node."""


class PolicyDoesNotFitError(BudgetTooSmallError):
    """The chosen policy has no plan within the budget, though another policy may have one;
    ``minimum_bytes`` is what this policy's plan needs: ``least``, the least budget at which
    it fits where that was searched, else its refused plan's peak."""

    def __init__(self, budget: int, plan: Any, floor: int, least: int | None = None) -> None:
        need = max(int(plan.peak_bytes), floor) if least is None else int(least)
        super().__init__(budget, need, plan.policy)
        self.plan = plan
        self.args = (f"policy {plan.policy} cannot fit the budget {format_bytes(budget)}: "
                     f"{plan.reason}; its plan needs {format_bytes(need)} ({need} bytes), the "
                     f"smallest budget any plan reaches is {format_bytes(floor)}",)


class PolicyError(PoochError, TypeError):
    """A policy given as a function returned something other than a Plan (PoocH calls it on
    the first iteration's profile before any update, so this comes out with the models as
    they were)."""


class DeviceOutOfMemoryError(PoochError, MemoryError):
    """The device (the CPU device, measured or accounted) would hold more bytes than its budget."""


class RanksDisagreeError(PoochError):
    """Data-parallel ranks (ChainerMN) that must run the same iteration do not: different
    models, batch sizes, graphs or PoocH settings. Raised on every rank alike."""
