"""pooch-paper: PoocH's keep / swap search and recompute step as the paper describes them,
without our refinement (policies/pooch.py with ``refine=False``)."""
from __future__ import annotations

from pooch_ext.links import Link
from pooch_ext.plan import Plan
from pooch_ext.policies import pooch
from pooch_ext.policies.search import SearchStats
from pooch_ext.profile import Profile


def classify(profile: Profile, budget: int | str | None = None, link: Link | str | None = None,
             stats: SearchStats | None = None, host_budget: int | str | None = None) -> Plan:
    """The paper's PoocH plan; ``stats`` (optional) receives the search's counters."""
    return pooch.classify(profile, budget, link, refine=False, stats=stats,
                          host_budget=host_budget)
