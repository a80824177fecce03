"""Partial views the graph retains (hooks/views.py): an NStepLSTM tagger at the minimum
budget PoocH reports.

Chainer's NStepLSTM splits the carried state when sequences end (``split_axis(h, [batch])``)
and the LSTM and Linear nodes of that step retain the first part, a view of the whole state;
each such view pins the rows of the ended sequences too, which no profile counts. The script
builds the graph of one iteration in plain Chainer and sums what the retained partial views
pin beyond their own bytes, then trains under PoocH (which gives such nodes dense copies)
at the minimum budget and prints the most held, per program: the profiling iterations
(swap-all) and the planned ones.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python experiments/diagnose_views.py
"""
from __future__ import annotations

import sys

import numpy as np

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer

from pooch_ext import BudgetTooSmallError, PoocH
from pooch_ext.hooks.model_state import base_of
from pooch_ext.testing import NStepTagger

VOCAB = 60


def pinned_bytes(loss: chainer.Variable) -> int:
    """Bytes that retained partial views keep alive beyond their own (each base once)."""
    bases: dict[int, tuple[int, int]] = {}
    stack, seen = [loss.creator_node], set()
    while stack:
        function = stack.pop()
        if function is None or id(function) in seen:
            continue
        seen.add(id(function))
        for node in function.inputs:
            array = node.data
            if array is not None and array.base is not None:
                base = base_of(array)
                if base.nbytes > array.nbytes:
                    total, own = bases.get(id(base), (base.nbytes, 0))
                    bases[id(base)] = (total, own + array.nbytes)
            stack.append(node.creator_node)
    return sum(max(0, total - own) for total, own in bases.values())


def train(batch: list, budget: int, iterations: int = 5) -> PoocH:
    np.random.seed(0)
    model = NStepTagger(VOCAB)
    optimizer = chainer.optimizers.Adam()
    optimizer.setup(model)
    with PoocH(model, budget=budget, verbose=False) as pooch:
        for _ in range(iterations):
            loss = model(batch)
            model.cleargrads()
            loss.backward()
            optimizer.update()
    return pooch


def main() -> int:
    rs = np.random.RandomState(3)
    batch = [rs.randint(1, VOCAB, rs.randint(3, 20)).astype("i") for _ in range(32)]
    np.random.seed(0)
    print(f"bytes pinned by retained partial views: {pinned_bytes(NStepTagger(VOCAB)(batch))}")
    try:
        train(batch, 1000)
        return 1
    except BudgetTooSmallError as refusal:
        minimum = refusal.minimum_bytes
    pooch = train(batch, minimum, iterations=6)
    print(f"minimum {minimum} bytes; under PoocH {len(pooch.overruns)} overruns")
    runs = pooch.iterations.iloc[1:]
    for program, peaks in runs.groupby("program", sort=False).peak_bytes:
        print(f"  {program}: most held {peaks.max()} bytes ({peaks.max() / minimum - 1:+.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
