"""Which parameters an update changed after an op's forward read them.

A map PoocH freed is rebuilt by running its forward ops again (a planned recompute, or an
on-demand restore for a backward pass the plan did not foresee). Plain Chainer's backward
reads what the forward saved, so a rebuild equals it only while the parameters the ops read
are those their forward read: after an optimizer update changed one (a second backward over
the graph after the update), the rebuild would silently differ. The executor stamps each
forward op with the number of parameter updates so far, the update gate reports each one,
and a rebuild that would read a parameter updated since is refused (SpentGraphError).
"""
from __future__ import annotations

from typing import Any

STAMP = "_pooch_updates_before"   # on a FunctionNode: parameter updates when its forward ran


class UpdateStamps:
    """Counts parameter updates and remembers each parameter's last (by identity)."""

    def __init__(self) -> None:
        self.count = 0
        self.changed: dict[int, int] = {}      # id(parameter) -> count after its last update

    def updated(self, param: Any) -> None:
        """An update rule is about to change ``param`` (hooks/update_gate.py)."""
        self.count += 1
        self.changed[id(param)] = self.count

    def stamp(self, function: Any) -> None:
        """``function``'s forward runs now."""
        setattr(function, STAMP, self.count)

    def changed_input(self, function: Any) -> Any:
        """A parameter ``function`` reads that an update changed after its forward, or None."""
        at = getattr(function, STAMP, None)
        if at is None or not self.changed:
            return None
        for node in function.inputs:
            variable = node.get_variable_or_none()
            if variable is not None and self.changed.get(id(variable), 0) > at:
                return variable
        return None
