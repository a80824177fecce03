"""What the runtime asks of a device: the one interface hooks/executor.py, hooks/profiler.py
and PoocH drive, met by ``CupyDevice`` (hooks/device.py) and ``CpuDevice``
(hooks/cpu_device.py). A new device (another accelerator, a remote host) implements these
members and nothing else; tests/test_device.py checks that both devices do.

Not to be confused with ``pooch_ext.profile.Device``, the plain description (name, capacity,
kind) a Profile carries. The CPU device has three members more, for measured memory:
``enforce`` (whether an overrun raises), ``on_overrun`` (called instead, after updates) and
``held`` (bytes held, from an allocator count); the runtime uses them where ``kind == "cpu"``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from pooch_ext.hooks.device import Transfer
    from pooch_ext.links import Link


@runtime_checkable
class RuntimeDevice(Protocol):
    kind: str                      # "cuda" or "cpu"
    name: str
    link: Link | None              # the copy engines' link, where known
    peak: int                      # bytes, since reset_peak()

    @property
    def xp(self) -> Any:
        """The array module (cupy or numpy)."""

    @property
    def capacity_bytes(self) -> int:
        """What the device offers: its budget, else its memory."""

    def set_budget(self, budget: int | None) -> None:
        """Hold training to ``budget`` bytes (None: no limit)."""

    def restore(self) -> None:
        """Undo set_budget and every other change to the device's state."""

    def host_side(self) -> Any:
        """A context in which the work done is the runtime's own, not the training step's."""

    def apart(self) -> Any:
        """A context whose work (measurements on probes, the profiler's reruns of an op) is
        outside the budget and the peak, and whose arrays are freed when it ends."""

    def note_resident(self, model: Any) -> None:
        """Count the model's parameters, gradients and persistents as resident."""

    def track(self, array: Any, tensor: int = -1) -> None:
        """An array the graph now holds on the device (for accounting where it is tracked)."""

    def used_bytes(self) -> int:
        """Bytes the training step holds on the device now."""

    def reset_peak(self) -> None:
        """Start a new peak from the bytes used now."""

    def check(self, where: str = "", index: int | None = None, function: Any = None) -> None:
        """Raise DeviceOutOfMemoryError (naming ``where``) when over the budget."""

    def swap_out(self, array: Any, timed: bool = False) -> Transfer:
        """Start copying ``array`` to the host after the compute already queued."""

    def finish_swap_out(self, transfer: Transfer) -> None:
        """Block until the copy is done; only then may the device copy be dropped."""

    def swap_in(self, transfer: Transfer, timed: bool = False) -> Any:
        """Allocate the device array and start the copy back; returns the array."""

    def landed(self, transfer: Transfer, direction: str) -> bool:
        """Whether the copy in ``direction`` ("d2h" or "h2d") has finished (no waiting)."""

    def wait_swap_in(self, transfer: Transfer) -> None:
        """Make compute wait for the swap-in."""

    def discard(self, transfer: Transfer) -> None:
        """Give the transfer's host buffer back and let go of the device array it kept (the
        host copy will not be read)."""

    def transfer_seconds(self, transfer: Transfer) -> tuple[float | None, float | None]:
        """How long the swap-out and swap-in took (None: not timed or not run)."""

    def timer(self) -> Any:
        """A timer of compute: start(), stop(), seconds()."""

    def synchronize(self) -> None:
        """Wait for all queued work, compute and copies."""
