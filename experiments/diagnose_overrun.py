"""A tight-budget check on the CPU device: measured against predicted memory around a
recomputation (the regression case of ``held_between_ops``, sim/memory.py rule 4).

small-resnet b32, the budget 5% of the way from the smallest budget any plan reaches to the
in-core need, policy pooch, five iterations, eight times in one process. Before the model charged
what Chainer's backward loop holds between ops, plans that recomputed one 2 MB first-stage map
at boundary 74 measured one such map more than predicted there (18.24 MB against 15.64-16.15
MB) in every executed iteration, in 4 of 8 runs; after it, 0 of 8. Per run it prints the
device's peak at each check around op 73 beside the simulator's peak of that op (the device's
peak is the most held since the iteration began, or since the last overrun it reported), and
the schedule's actions at boundaries 66-74.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python experiments/diagnose_overrun.py
"""
from __future__ import annotations

import sys

import pooch_ext  # noqa: F401  (chainer import compat)
from pooch_ext.hooks.cpu_device import CpuDevice
from pooch_ext.measure import setup_model
from pooch_ext.sim.budgets import budget_between
from pooch_ext.sim.check import schedule_memory
from pooch_ext.testing import synthetic_batches, train

WATCHED = 73          # the op where the overrun showed


def main(runs: int = 8) -> int:
    log: list[tuple] = []
    check = CpuDevice.check

    def logged(self, where="", index=None, function=None):
        log.append((index, type(function).__name__ if function is not None else "", self.peak))
        return check(self, where, index, function)
    CpuDevice.check = logged

    def run(pooch: dict, n: int):
        model, optimizer = setup_model("small-resnet", gpu=False)
        result = train(model, optimizer, synthetic_batches(n, 32, (3, 32, 32), 10),
                       dict(pooch, device=CpuDevice(link="cpu"), verbose=False))
        return result.pooch

    try:
        bounds = run({"profile_iters": 3, "policy": None}, 4).profile
        budget = budget_between(bounds, 0.05)
        for i in range(runs):
            log.clear()
            pooch = run({"profile_iters": 3, "policy": "pooch", "budget": budget}, 5)
            plan = pooch.plan
            levels = schedule_memory(pooch.profile, plan.schedule, plan.configs).peak_bytes
            last = max(j for j, entry in enumerate(log) if entry[0] == WATCHED)
            print(f"run {i}: {'OVERRUN' if pooch.overruns else 'ok'}, classes {plan.counts}, "
                  f"plan peak {plan.peak_bytes}, budget {budget}")
            for index, name, peak in log[last - 4: last + 1]:
                print(f"    op {index} {name}: measured {peak}, predicted {int(levels.iloc[index])}")
            schedule = plan.schedule
            print("    actions:", [(int(b), a, int(t)) for b, a, t in
                                   zip(schedule.boundary, schedule.action, schedule.tensor)
                                   if WATCHED - 7 <= b <= WATCHED + 1])
    finally:
        CpuDevice.check = check
    return 0


if __name__ == "__main__":
    sys.exit(main())
