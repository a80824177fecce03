"""What every policy does around its decision: resolve inputs, check the minimum, simulate."""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

from pooch_ext.links import Link, get_link
from pooch_ext.plan import Plan
from pooch_ext.profile import Profile
from pooch_ext.sim.model import NAME, SimModel, compile_profile
from pooch_ext.sim.budgets import require_budget, require_host_budget
from pooch_ext.sim.engine import simulate_plan


class Context:
    """A policy's inputs, resolved once: the model on the link, the budgets in bytes (the
    host budget math.inf when unlimited), a clock. Budgets no plan can meet are refused here
    (BudgetTooSmallError, HostBudgetTooSmallError), for every policy alike."""

    def __init__(self, profile: Profile, budget: int | str | None, link: Link | str | None,
                 policy: str, host_budget: int | str | None = None) -> None:
        self.started = time.perf_counter()
        self.profile = profile
        self.policy = policy
        self.link = None if link is None else get_link(link)
        self.budget = require_budget(profile, budget, policy)
        self.host_budget = require_host_budget(profile, self.budget, host_budget, policy)
        self.model: SimModel = compile_profile(profile, self.link)

    def plan(self, codes: np.ndarray, timing: str = "early", reason: str = "",
             r: dict[int, float] | None = None, configs: dict[int, int] | None = None) -> Plan:
        """Simulate the chosen classes into a finished Plan (schedule, table, seconds taken);
        ``r``: tensor id -> r(X) where PoocH computed it, for the table's r column;
        ``configs``: op -> pieces fixed by the policy (None: the simulator chooses)."""
        classes = {int(t): NAME[int(c)] for t, c in zip(self.model.tensor, codes)}
        plan = Plan(self.policy, classes, swap_in_timing=timing, reason=reason,
                    configs=configs or {})
        if r:   # simulate_plan's table keeps the r values it finds in plan.table
            plan.table = pd.DataFrame({"tensor": list(r), "r": list(r.values())})
        plan = simulate_plan(self.profile, plan, self.link, self.budget, self.host_budget)
        plan.classify_seconds = time.perf_counter() - self.started
        return plan
