"""The profile PoocH plans a graph on, made from the iterations it measured: copy times from
the given link, the CPU device's own, or a link fitted to the copies measured on a GPU
(pcie3 where none was); the device at the budget; what the models hold throughout."""
from __future__ import annotations

from typing import Any

from pooch_ext.hooks.conv_configs import measured_configs
from pooch_ext.hooks.measured_profile import build_profile, fit_link
from pooch_ext.hooks.model_state import resident_bytes
from pooch_ext.links import Link, get_link
from pooch_ext.profile import Device, Profile


def runtime_profile(samples: list, link_setting: Link | str, device: Any, models: Any,
                    budget_bytes: int, split_convolutions: bool,
                    allreduce: Any = None, unrefusable: bool = False) -> Profile:
    """``samples``: hooks/measured_profile.IterationSample of one graph (the last one's trace
    names it); ``link_setting``: PoocH's ``link`` ("auto": copy times as the copy engines
    took them); ``allreduce``: the data-parallel meter, if any; ``unrefusable``: past the first
    iteration, where no refusal can come (hooks/measured_profile.gap_floors)."""
    trace = samples[-1].trace
    link = link_setting if isinstance(link_setting, Link) else None
    if link is None:
        link = (device.link if device.kind == "cpu"
                else fit_link(samples[1:] or samples) or get_link("pcie3"))
    batch = next((t.shape[0] for t in trace.tensors if t.producer < 0 and t.shape), None)
    meta = {"model": models.name, "batch": batch, "device_kind": device.kind}
    measure_splits = (lambda call: measured_configs(call, device)) if split_convolutions \
        else None
    return build_profile(samples, Device(device.name, int(budget_bytes), device.kind), link,
                         resident_bytes(models), meta, measured_swaps=link_setting == "auto",
                         configs_of=measure_splits,
                         after_backward=allreduce.after_backward() if allreduce else None,
                         unrefusable=unrefusable)
