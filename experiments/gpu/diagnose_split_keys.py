"""Which split-convolution exactness checks a planned iteration runs inside its ops.

A split part runs in pieces where ``hooks/split_exact`` found it bit-identical on probes; the
profile's measurement (hooks/conv_configs.measure) checks every key a planned iteration will
look up, so a planned op never probes (probes and the whole op's scratch inside an op are
memory the plan does not count). This trains small-resnet under PoocH and lists the checks
made outside the measurement, each with how its key differs from the nearest measured one.
On the CPU device there are none; on the first GPU that enforced the pool limit, probes
inside planned input-gradient ops ran the pool out of memory.

    python experiments/gpu/diagnose_split_keys.py [--gpu] [--batch 16] [--fraction 0.5]
"""
from __future__ import annotations

import argparse
import traceback


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--fraction", type=float, default=0.5)
    args = parser.parse_args()

    import numpy as np

    import pooch_ext  # noqa: F401
    from pooch_ext.hooks import split_exact
    from pooch_ext.models import get_model
    from pooch_ext.sim.budgets import budget_between
    from pooch_ext.testing import make_optimizer, synthetic_batches, train

    checks = []
    real = split_exact._exact

    def spy(self, pieces_core, whole_core, arrays, pieces):
        key = split_exact._key(self, pieces_core, arrays, pieces)
        measuring = any("conv_configs" in f.filename for f in traceback.extract_stack())
        if key not in split_exact._EXACT and not measuring:
            near = [k for k in split_exact._EXACT if k[:2] == key[:2]]
            diffs = []
            for k in near:
                d = [f"attr {split_exact._ATTRS[i]}: measured {a} run {b}"
                     for i, (a, b) in enumerate(zip(k[3], key[3])) if a != b]
                d += [f"array {i}: measured {a} run {b}"
                      for i, (a, b) in enumerate(zip(k[4], key[4])) if a != b]
                d += [f"pieces: measured {k[2]} run {key[2]}"] if k[2] != key[2] else []
                diffs.append(d)
            checks.append((type(self).__name__, pieces_core.__qualname__, pieces,
                           min(diffs, key=len) if diffs else ["no measured key of this core"]))
        return real(self, pieces_core, whole_core, arrays, pieces)

    split_exact._exact = spy
    xp = np
    if args.gpu:
        import cupy as xp
    data = [(xp.asarray(x), xp.asarray(t))
            for x, t in synthetic_batches(7, args.batch, (3, 32, 32), 10)]

    def model():
        np.random.seed(0)
        m = get_model("small-resnet")
        return m.to_gpu() if args.gpu else m

    first = model()
    probe = train(first, make_optimizer(first, "momentum"), data[:3],
                  {"profile_iters": 3, "policy": None, "verbose": False})
    budget = budget_between(probe.pooch.profile, args.fraction)
    del probe, first
    checks.clear()
    m = model()
    run = train(m, make_optimizer(m, "momentum"), data,
                {"profile_iters": 3, "policy": "pooch", "budget": budget, "verbose": False})
    print(f"small-resnet b{args.batch} at {args.fraction} ({budget} B): error {run.error!r:.200}")
    print(f"{len(checks)} exactness checks outside the measurement; measured keys "
          f"{len(split_exact._EXACT)}")
    for name, core, pieces, diff in checks[:10]:
        print(f"  {name} {core} x{pieces}: " + "; ".join(diff))


if __name__ == "__main__":
    main()
