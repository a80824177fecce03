"""pooch seeded with the plan of the MILP bound's program (pooch_ext/milp_bound.py), for
classifying away from the training run (the command line, benchmarks), where seconds to a
couple of minutes of solving are no object.

The local search ends in the basin it starts from; the program's classes (a relaxation's
optimum, slower as they stand: 1.97 s on ResNet-50 b512 pcie3 at 0.3 of the in-core need)
start it in one its own seeds may not reach: there 1883 ms against pooch's 1918 (the bound:
1852; 1884 ms with 64 times pooch's search), and within 1% of the bound from 0.4 of the
in-core need on (pooch alone: 2.2%; results/README "Distance to a proven bound"). The
refinement never returns a plan slower than a seed that fits; its work is shared with the
extra seed, so pooch alone is run too and the faster plan kept: never slower than pooch.
"""
from __future__ import annotations

import dataclasses
import time

from pooch_ext.links import Link
from pooch_ext.milp_bound import MilpBound, milp_bound
from pooch_ext.plan import Plan
from pooch_ext.policies import pooch
from pooch_ext.policies.common import Context
from pooch_ext.profile import Profile
from pooch_ext.sim.model import NAME, SimModel

TIME_LIMIT_S = 120.0    # the solve's limit; its best plan so far seeds the search after it


def classify(profile: Profile, budget: int | str | None = None, link: Link | str | None = None,
             host_budget: int | str | None = None) -> Plan:
    """pooch's plan, its search also seeded with the MILP bound's plan (where that fits)."""
    started = time.perf_counter()
    ctx = Context(profile, budget, link, "pooch-milp", host_budget)    # refuses bad budgets
    seed = bound_plan(ctx.model, milp_bound(ctx.model, ctx.budget, TIME_LIMIT_S))
    plan = pooch.faster(*(pooch.classify(profile, ctx.budget, link, host_budget=host_budget,
                                         seeds=given) for given in ([seed], [])))
    return dataclasses.replace(plan, policy="pooch-milp",
                               classify_seconds=time.perf_counter() - started)


def bound_plan(model: SimModel, bound: MilpBound) -> Plan:
    """The classes of ``bound``'s program (``milp_bound`` of ``model``) as a plan to seed
    pooch with (not simulated)."""
    return Plan("pooch-milp", {int(t): NAME[int(c)] for t, c in zip(model.tensor, bound.codes)})
