"""vdnn-all: vDNN offloading the input feature maps of every layer."""
from __future__ import annotations

from pooch_ext.plan import Plan
from pooch_ext.policies.vdnn_common import classify_vdnn


def classify(profile, budget=None, link=None) -> Plan:
    return classify_vdnn(profile, budget, link, "vdnn-all", conv_only=False)
