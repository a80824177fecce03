"""Classification policies: each module has ``classify(profile, budget, link, host_budget=None)
-> Plan``.

``budget`` is bytes (int or a string such as "16GiB"; None: the device capacity), ``link`` a
Link or preset name (None: the profile's own swap times), ``host_budget`` the host memory the
swapped maps may hold at once (the same forms, 0 allowed; None: unlimited). A policy whose
classes cannot fit returns a plan with ``feasible=False`` and the reason, never one that
overflows; a budget below ``simulator.minimum_budget`` raises BudgetTooSmallError carrying that
minimum, a host budget below ``simulator.minimum_host_budget`` HostBudgetTooSmallError
(common.Context refuses both, for every policy).
"""
from __future__ import annotations

import importlib
from types import ModuleType

from pooch_ext.errors import check_name

POLICY_NAMES = ("pooch", "swap-opt", "swap-all", "swap-all-nosched", "in-core", "superneurons",
                "vdnn-all", "vdnn-conv", "sqrt-n", "pooch-paper")


def get_policy(name: str) -> ModuleType:
    """The policy module called ``name``; it has ``classify(profile, budget, link,
    host_budget=None) -> Plan``."""
    check_name(name, POLICY_NAMES, "policy")
    return importlib.import_module(f"pooch_ext.policies.{name.replace('-', '_')}")
