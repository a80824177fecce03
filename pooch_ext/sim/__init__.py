"""The timeline simulator: what a plan costs in time and memory before anything runs.

``memory`` states the memory rule every consumer applies; ``model`` compiles a Profile into
arrays (SimModel) with the static bounds of a classification; ``budgets`` resolves budgets and
answers what fits without simulating; ``engine`` walks the boundaries with three engines
(compute, swap-out, swap-in), and ``timeline`` turns what it recorded into the Timeline and
the schedule; ``batch`` predicts many class vectors at once for the search; ``check`` is the
independent checker of a schedule (it shares nothing with the engine but the Profile and the
memory rule, on purpose, so a bug in one shows as a disagreement).
"""
