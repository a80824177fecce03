"""The timeline simulator: what a plan costs in time and memory before anything runs.

``model`` compiles a Profile into arrays (SimModel) and states the memory rule every
consumer applies; ``engine`` walks the boundaries with three engines (compute, swap-out,
swap-in) and returns the Timeline and schedule; ``batch`` predicts many class vectors at once
for the search; ``check`` is the independent checker of a schedule (it shares nothing with the
engine but the Profile, on purpose, so a bug in one shows as a disagreement).
"""
