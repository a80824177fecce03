"""Classification policies: each module has classify(profile, budget, link) -> Plan."""
