"""Classification policies: each module has ``classify(profile, budget, link, host_budget=None)
-> Plan``.

``budget`` is bytes (int or a string such as "16GiB"; None: the device capacity), ``link`` a
Link or preset name (None: the profile's own swap times), ``host_budget`` the host memory the
swapped maps may hold at once (the same forms, 0 allowed; None: unlimited). A policy whose
classes cannot fit returns a plan with ``feasible=False`` and the reason, never one that
overflows; a budget below ``sim.budgets.minimum_budget`` raises BudgetTooSmallError carrying that
minimum, a host budget below ``sim.budgets.minimum_host_budget`` HostBudgetTooSmallError
(common.Context refuses both, for every policy).
"""
from __future__ import annotations

import importlib
import math
from types import ModuleType
from typing import TYPE_CHECKING, Callable

from pooch_ext.errors import check_name

if TYPE_CHECKING:
    from pooch_ext.links import Link
    from pooch_ext.plan import Plan
    from pooch_ext.profile import Profile

# The registry: a policy's public name -> the module that implements it (imported on first use,
# so the planning core stays light). Adding a policy is one line here plus its module.
POLICIES = {
    "pooch": "pooch_ext.policies.pooch",
    "swap-opt": "pooch_ext.policies.swap_opt",
    "swap-all": "pooch_ext.policies.swap_all",
    "swap-all-nosched": "pooch_ext.policies.swap_all_nosched",
    "in-core": "pooch_ext.policies.in_core",
    "superneurons": "pooch_ext.policies.superneurons",
    "vdnn-all": "pooch_ext.policies.vdnn_all",
    "vdnn-conv": "pooch_ext.policies.vdnn_conv",
    "vdnn-dyn": "pooch_ext.policies.vdnn_dyn",
    "sqrt-n": "pooch_ext.policies.sqrt_n",
    "pooch-paper": "pooch_ext.policies.pooch_paper",
    "pooch-milp": "pooch_ext.policies.pooch_milp",
}
POLICY_NAMES = tuple(POLICIES)


def get_policy(name: str) -> ModuleType:
    """The policy module called ``name``; it has ``classify(profile, budget, link,
    host_budget=None) -> Plan``."""
    check_name(name, POLICY_NAMES, "policy")
    return importlib.import_module(POLICIES[name])


def check_policy(policy: object) -> None:
    """A known policy name, a callable or None; else the error at once (an int was
    accepted and failed at the first classification as "'int' object is not callable")."""
    if isinstance(policy, str):
        get_policy(policy)                     # unknown names fail here, listing the known
    elif policy is not None and not callable(policy):
        raise TypeError(f"policy must be a name ({', '.join(POLICY_NAMES)}), a function "
                        f"classify(profile, budget, link) -> Plan, or None; got {policy!r}")


def classify(profile: Profile, budget: int | str | None = None, policy: str = "pooch",
             link: Link | str | None = None, host_budget: int | str | None = None) -> Plan:
    """A Plan for ``profile`` under ``budget`` by the named policy (see the module docstring
    for the arguments and the refusals)."""
    return get_policy(policy).classify(profile, budget, link, host_budget=host_budget)


def fitting_plan(profile: Profile, policy: str | Callable, budget: int,
                 host_budget: float = math.inf) -> Plan:
    """The plan of ``policy`` (a name, or any ``classify(profile, budget, link) -> Plan``, also
    given ``host_budget=`` when one is set) that fits ``budget``, else PolicyDoesNotFitError
    with the smallest budget any plan reaches. A policy that returns classes only is
    simulated here."""
    from pooch_ext.errors import PolicyDoesNotFitError, PolicyError
    from pooch_ext.plan import Plan
    from pooch_ext.sim.budgets import minimum_budget
    from pooch_ext.sim.engine import simulate_plan

    run = get_policy(policy).classify if isinstance(policy, str) else policy
    host = {} if math.isinf(host_budget) else {"host_budget": host_budget}

    def at(budget: int) -> Plan:
        plan = run(profile, budget, None, **host)
        if not isinstance(plan, Plan):
            raise PolicyError(f"policy {getattr(policy, '__name__', policy)!r} returned "
                              f"{type(plan).__name__} {plan!r:.60}, not a pooch_ext.Plan")
        if plan.feasible is None:
            plan = simulate_plan(profile, plan, None, budget,
                                 None if math.isinf(host_budget) else int(host_budget))
        return plan
    plan = at(budget)
    if not plan.feasible:
        floor = minimum_budget(profile)
        highs = (int(plan.peak_bytes), max(floor, int(profile.incore_peak_bytes)))
        raise PolicyDoesNotFitError(budget, plan, floor, _least_fitting(at, budget, highs))
    return plan


def refuse_below_floor(profile: Profile, policy: str | Callable, budget: int,
                       host_budget: float = math.inf) -> None:
    """Nothing where ``budget`` reaches the smallest budget any plan reaches; else the
    refusal, naming the least budget ``policy`` itself fits (PolicyDoesNotFitError) where
    that lies above: a fixed-rule policy (superneurons, sqrt-n, vdnn-conv) refused at
    budget=1 named the floor, and was refused again there with its own minimum."""
    from pooch_ext.errors import BudgetTooSmallError, PolicyDoesNotFitError
    from pooch_ext.sim.budgets import minimum_budget

    floor = minimum_budget(profile)
    if budget >= floor:
        return
    try:
        fitting_plan(profile, policy, floor, host_budget)
    except PolicyDoesNotFitError as refused:
        raise PolicyDoesNotFitError(budget, refused.plan, floor, refused.minimum_bytes) from None
    except BudgetTooSmallError:
        pass            # the host budget binds there too: the device's floor comes first
    raise BudgetTooSmallError(budget, floor, profile.meta.get("model", ""))


def _least_fitting(at: Callable[[int], Plan], low: int, highs: tuple[int, ...]) -> int | None:
    """The least budget above ``low`` (which does not fit) at which ``at(budget)`` fits, to
    0.1%, searched below the first of ``highs`` that fits; None where none does. A
    fixed-rule policy's refused plan is not the one it makes for a larger budget, so its
    peak says little: sqrt-n on a user's ResNet refused 3000000 bytes with a plan needing
    7422372 (above the in-core need) and fits within 4000000."""
    high = next((h for h in sorted(set(highs)) if h > low and at(h).feasible), None)
    if high is None:
        return None
    while high - low > max(1, high // 1000):
        middle = (low + high) // 2
        if at(middle).feasible:
            high = middle
        else:
            low = middle
    return high
