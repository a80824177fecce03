"""Where a budgeted GPU run holds more than its plan predicts: the pool's used bytes in every
op beside the simulator's peak of that op, with the budget planned but not enforced.

    python experiments/gpu/diagnose_memory.py resnet50 160 6993853440 swap-all pooch
    python experiments/gpu/diagnose_memory.py small-resnet 8 200000 pooch --cpu   # the logic

The pool limit is left off (``CupyDevice.set_budget`` records the budget only), so the run
goes on where the real one ran out of memory. Per executed iteration it prints the program,
the highest ``used_bytes`` after any allocation and the op where it happened (an op's
boundary actions count with the op before it), the pool's highest ``total_bytes`` (used plus
cached and split-off blocks: fragmentation), and, for the planned iterations, the ops whose
measured bytes exceed their predicted peak the most. Split convolutions are off (measuring
them on a GPU was too slow when this was written). The outputs in results/gpu/h100_diagnose/
came from an earlier version that keyed each allocation one boundary late: read only their
peaks and totals there, not their "most over" lines.
"""
from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pooch_ext  # noqa: E402,F401  (chainer import compat)
from pooch_ext.hooks import profiler  # noqa: E402
from pooch_ext.measure import setup_model  # noqa: E402
from pooch_ext.models import default_input_size, default_n_classes  # noqa: E402
from pooch_ext.sim.check import schedule_memory  # noqa: E402
from pooch_ext.testing import synthetic_batches, train  # noqa: E402
from pooch_ext.units import format_bytes  # noqa: E402


def _recorder(pooch_of, used, total):
    """(observe(), levels): observe() notes the used / total bytes now against the op the
    executor is at (the one running, or whose boundary actions run; -1 before the first);
    levels[(iteration, op)] = highest used there."""
    levels: dict[tuple[int, int], int] = {}
    peaks = {"total": 0}

    def observe() -> None:
        pooch = pooch_of()
        runtime = getattr(pooch, "runtime", None) if pooch is not None else None
        if runtime is None:
            return
        key = (len(runtime.history), int(getattr(runtime, "_next_boundary", 0)) - 1)
        levels[key] = max(levels.get(key, 0), used())
        peaks["total"] = max(peaks["total"], total())
    return observe, levels, peaks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("batch", type=int)
    parser.add_argument("budget", type=int, help="bytes the plan is made for")
    parser.add_argument("policies", nargs="+")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--profile-iters", type=int, default=2)
    parser.add_argument("--cpu", action="store_true", help="the host-simulated device")
    parser.add_argument("--log-dir", type=Path, default=None,
                        help="write every iteration's pool malloc/free events there, with the "
                             "executor's actions in order (allocations_<policy>.csv, as "
                             "pool_strategies.py reads them), and the profile and plan")
    parser.add_argument("--async-pool", action="store_true",
                        help="CuPy's MemoryAsyncPool (cudaMallocAsync) instead of its MemoryPool")
    args = parser.parse_args(argv)
    profiler.conv_call = lambda function, in_data: None          # no split convolutions
    current = {"pooch": None}
    if args.cpu:
        from pooch_ext.hooks.device import HostSimDevice
        device_of = HostSimDevice
        used = total = (lambda: 0)
    else:
        import cupy
        from cupy.cuda.memory_hook import MemoryHook

        from pooch_ext.hooks.device import CupyDevice

        pool = cupy.get_default_memory_pool()
        if args.async_pool:
            pool = cupy.cuda.MemoryAsyncPool()
            cupy.cuda.set_allocator(pool.malloc)
        used, total = (lambda: int(pool.used_bytes())), (lambda: int(pool.total_bytes()))

        class Unenforced(CupyDevice):
            def set_budget(self, budget):      # planned for, never a pool limit
                self.budget = budget
        device_of = Unenforced
    for policy in args.policies:
        observe, levels, peaks = _recorder(lambda: current["pooch"], used, total)
        events: list[tuple] = []
        hook: Any = nullcontext()
        if not args.cpu:
            def event(kind, kwargs, events=events):
                runtime = getattr(current["pooch"], "runtime", None)
                if runtime is not None:
                    events.append((len(runtime.history), len(events),
                                   int(getattr(runtime, "_next_boundary", 0)) - 1, kind,
                                   int(kwargs["mem_size"]), -1, int(kwargs["mem_ptr"])))

            class Watch(MemoryHook):
                name = "PoochDiagnose"

                def malloc_postprocess(self, observe=observe, **kwargs):
                    observe()
                    event("malloc", kwargs)

                def free_postprocess(self, **kwargs):
                    event("free", kwargs)
            hook = Watch()
        # the executor's actions in the same stream, each after the mallocs and frees it made
        from pooch_ext.hooks.executor import Executor
        log_action = Executor.log_action

        def logged(self, action, tensor, boundary=None, *rest, log_action=log_action,
                   events=events, **kwargs):
            log_action(self, action, tensor, boundary, *rest, **kwargs)
            events.append((len(self.history), len(events), self.executed[-1][0], action, 0,
                           int(tensor), 0))
        Executor.log_action = logged
        model, optimizer = setup_model(args.model, not args.cpu)
        xp = __import__("numpy" if args.cpu else "cupy")
        batches = synthetic_batches(args.iters, args.batch, default_input_size(args.model),
                                    default_n_classes(args.model), xp=xp)

        def after(result, observe=observe):
            observe()
        pooch_args = dict(profile_iters=args.profile_iters, budget=args.budget, policy=policy,
                          device=device_of(), verbose=False)
        # the first iteration's PoocH object is known only once train() made it: peek it
        import pooch_ext.pooch as pooch_module
        original_enter = pooch_module.PoocH.__enter__

        def enter(self, original_enter=original_enter):
            current["pooch"] = self
            return original_enter(self)
        pooch_module.PoocH.__enter__ = enter
        try:
            with hook:
                result = train(model, optimizer, batches, pooch_args, after_step=after)
        finally:
            pooch_module.PoocH.__enter__ = original_enter
            Executor.log_action = log_action
        pooch = result.pooch
        if args.log_dir is not None and pooch is not None and pooch.plan is not None:
            args.log_dir.mkdir(parents=True, exist_ok=True)
            pooch.profile.save(args.log_dir / f"profile_{policy}")
            pooch.plan.to_csv(args.log_dir / f"plan_{policy}.csv")
        if args.log_dir is not None and events:
            import pandas as pd
            from pooch_ext.hooks.allocator import EVENT_COLUMNS
            args.log_dir.mkdir(parents=True, exist_ok=True)
            pd.DataFrame(events, columns=["iteration", *EVENT_COLUMNS]).to_csv(
                args.log_dir / f"allocations_{policy}.csv", index=False)
        print(f"== {args.model} b{args.batch} {policy} planned for {format_bytes(args.budget)}"
              f" ({args.budget} B); error: {result.error!r}")
        if pooch is None:
            continue
        plan = pooch.plan
        predicted = None
        if plan is not None:
            predicted = schedule_memory(pooch.profile, plan.schedule, plan.configs)
            print(f"plan {plan.policy}: predicted peak {format_bytes(plan.peak_bytes)}; "
                  f"profile in-core {format_bytes(pooch.profile.incore_peak_bytes)}")
        print(f"pool total_bytes peak {format_bytes(peaks['total'])}")
        if len(pooch.iterations):
            print(pooch.iterations[["iteration", "program", "peak_bytes", "swap_outs",
                                    "recomputes", "on_demand"]].to_string(index=False))
        for iteration in sorted({i for i, _ in levels}):
            here = {k: v for (i, k), v in levels.items() if i == iteration}
            op = max(here, key=here.get)
            line = (f"iteration {iteration}: used peak {format_bytes(here[op])} "
                    f"({here[op]} B) at op {op}")
            if predicted is not None and iteration >= args.profile_iters:
                # the last op also sees the update and the next iteration's start
                over = sorted(((v - int(predicted.peak_bytes.iloc[k]), k) for k, v in here.items()
                               if 0 <= k < len(predicted) - 2), reverse=True)[:5]
                line += "; most over the predicted peak: " + ", ".join(
                    f"op {k} +{format_bytes(d)}" for d, k in over)
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
