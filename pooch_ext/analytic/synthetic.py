"""Small networks made with ProfileBuilder: hand-checkable chains and seeded random CNN-like graphs.

They exist so the simulator and the policies can be tested where the answer is known (a chain
with round numbers) and compared with the exact optimum (random graphs with few feature maps),
without a GPU and without a model tracer. Both follow the builder's memory rules exactly.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from pooch_ext.builder import ProfileBuilder
from pooch_ext.links import Link, get_link
from pooch_ext.profile import Device, Profile

FLOAT_BYTES = 4


def chain_profile(fwd_s: Sequence[float], bwd_s: Sequence[float] | None = None,
                  nbytes: int | Sequence[int] = 4000, link: Link | str = "pcie3",
                  capacity: int = 1 << 30, name: str = "LinearFunction",
                  transient_bytes: Sequence[int] | None = None) -> Profile:
    """A chain x -> op0 -> t1 -> op1 -> ... -> loss; op k (k >= 1) keeps its input for backward.

    ``nbytes`` per op output (multiple of 4); the last op is the loss (a scalar output), so
    the feature maps are the outputs of ops 0 .. n-2, all needed by the next op's backward.
    ``transient_bytes``: scratch each forward op allocates and frees while it runs.
    """
    n = len(fwd_s)
    bwd_s = list(fwd_s) if bwd_s is None else list(bwd_s)
    scratch = [0] * n if transient_bytes is None else list(transient_bytes)
    sizes = [nbytes] * n if isinstance(nbytes, (int, np.integer)) else list(nbytes)
    b = ProfileBuilder(Device("chain", int(capacity)), get_link(link), {"model": "chain"})
    h = b.input((sizes[0] // FLOAT_BYTES,))
    for k in range(n):
        last = k == n - 1
        shape = () if last else (sizes[k] // FLOAT_BYTES,)
        (h,) = b.forward("SoftmaxCrossEntropy" if last else name, [h], [(shape, "float32")],
                         fwd_s[k], bwd_s[k], retain_inputs=[0] if k else [],
                         transient_bytes=scratch[k], label=f"layer{k}")
    return b.build()


# per-op seconds per output byte on a V100-like device, drawn in a range per kind
_INTENSITY = {"conv": (0.5e-10, 4e-10), "bn": (0.2e-11, 1.5e-11), "relu": (0.1e-11, 0.8e-11),
              "pool": (0.3e-11, 1e-11), "add": (0.1e-11, 0.6e-11)}


def random_profile(seed: int, n_layers: int = 8, link: Link | str = "pcie3",
                   capacity: int = 16 << 30) -> Profile:
    """A seeded CNN-like graph: conv / bn / relu / pool layers with residual adds.

    Sizes are tens of MB and op times follow per-kind compute intensities, so on pcie3 a swap
    costs about as much as a light op and less than a conv: the regime where keep, swap and
    recompute all have a place.
    """
    rng = np.random.default_rng(seed)
    b = ProfileBuilder(Device("synthetic", int(capacity)), get_link(link),
                       {"model": f"random-{seed}", "batch": 1})
    elems = int(rng.integers(4, 16)) * (1 << 20)
    h = b.input((elems,))
    block_in, block_elems = None, 0   # the residual shortcut's source and its size
    kinds = ["conv"]
    while len(kinds) < n_layers:
        kinds.append(str(rng.choice(["conv", "bn", "relu", "pool", "add"], p=[.3, .25, .25, .1, .1])))
    for k, kind in enumerate(kinds):
        if kind == "pool":
            elems = max(1 << 18, elems // int(rng.choice([2, 4])))
            block_in = None
        if kind == "conv" and rng.random() < 0.4:
            elems = int(elems * rng.choice([0.5, 1, 2]))
            block_in = None
        nbytes = elems * FLOAT_BYTES
        t = float(rng.uniform(*_INTENSITY[kind])) * nbytes
        name, retain_in, retain_out = {
            "conv": ("Convolution2DFunction", [0], []), "bn": ("BatchNormalization", [0], []),
            "relu": ("ReLU", [], [0]), "pool": ("MaxPooling2D", [0], []), "add": ("Add", [], []),
        }[kind]
        inputs = [h]
        if kind == "add":
            if block_in is None or block_elems != elems:
                name, retain_in = "ReLU", []
                retain_out = [0]
            else:
                inputs = [h, block_in]
        scale = 2.0 if kind == "conv" else 1.0
        (h,) = b.forward(name, inputs, [((elems,), "float32")], t, scale * t,
                         retain_inputs=retain_in, retain_outputs=retain_out,
                         transient_bytes=nbytes // 2 if kind == "conv" else 0,
                         label=f"layer{k}/{kind}")
        if kind in ("relu", "add") and (block_in is None or rng.random() < 0.5):
            block_in, block_elems = h, elems
    (h,) = b.forward("LinearFunction", [h], [((1000,), "float32")], 2e-5, 4e-5, retain_inputs=[0],
                     label="fc")
    b.forward("SoftmaxCrossEntropy", [h], [((), "float32")], 1e-5, 1e-5, retain_inputs=[0],
              label="loss")
    b.resident(int(rng.integers(5, 40)) << 20)
    return b.build(update_s=1e-4)
