"""Why an NStepLSTM loop overruns a budget PoocH accepted (open, see results/README.md):
partial views that the graph retains keep their whole base array alive, which the profile
does not model (it charges a view its own bytes).

Chainer's NStepLSTM splits the carried state when sequences end (``split_axis(h, [batch])``)
and the LSTM and Linear nodes of that step retain the first part, a view of the whole state;
each such view pins the rows of the ended sequences too. The script builds the graph of one
iteration in plain Chainer and sums what the retained partial views pin beyond their own
bytes, then trains under PoocH at the minimum budget it reports and prints the largest
overrun of the planned iterations.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python experiments/diagnose_views.py
"""
from __future__ import annotations

import sys

import numpy as np

import pooch_ext  # noqa: F401  (chainer import compat)
import chainer
import chainer.functions as F
import chainer.links as L

from pooch_ext import BudgetTooSmallError, PoocH
from pooch_ext.hooks.model_state import base_of

VOCAB, UNITS = 60, 96


class Tagger(chainer.Chain):
    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.embed = L.EmbedID(VOCAB, UNITS)
            self.lstm = L.NStepLSTM(1, UNITS, UNITS, 0.0)
            self.out = L.Linear(UNITS, VOCAB)

    def forward(self, xs: list) -> chainer.Variable:
        cut = np.cumsum([len(x) for x in xs[:-1]])
        _, _, ys = self.lstm(None, None, F.split_axis(self.embed(F.concat(xs, 0)), cut, 0))
        return F.softmax_cross_entropy(self.out(F.concat(ys, 0)), F.concat(xs, 0))


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
    model = Tagger()
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
    print(f"bytes pinned by retained partial views: {pinned_bytes(Tagger()(batch))}")
    try:
        train(batch, 1000)
        return 1
    except BudgetTooSmallError as refusal:
        minimum = refusal.minimum_bytes
    pooch = train(batch, minimum)
    planned = [o for o in pooch.overruns if o["iteration"] >= 1]
    worst = max((o["held_bytes"] for o in planned), default=minimum)
    print(f"minimum {minimum} bytes; {len(planned)} overruns after the first update, "
          f"worst {worst} bytes held ({worst / minimum - 1:+.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
