"""vdnn-conv: vDNN offloading the input feature maps of convolutions only."""
from __future__ import annotations

from pooch_ext.links import Link
from pooch_ext.plan import Plan
from pooch_ext.policies.vdnn_common import classify_vdnn
from pooch_ext.profile import Profile


def classify(profile: Profile, budget: int | str | None = None,
             link: Link | str | None = None, host_budget: int | str | None = None) -> Plan:
    return classify_vdnn(profile, budget, link, "vdnn-conv", conv_only=True,
                         host_budget=host_budget)
