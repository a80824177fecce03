"""Gist's encodings in PoocH (issue 16): how much they shrink the in-core footprint, and
what they add to PoocH on the paper's x86 (PCIe gen3) and POWER9 (NVLink 2.0) hosts.

reduction.csv: one row per network and setting (``lossless``: Gist's lossless techniques,
binarize + sparse + in-place ReLUs; ``lossless+dpr``: also fp16 stashes; ``lossless+dpr8``:
also fp8 stashes, Gist's 1-4-3 floats), the in-core peak
(Gist's footprint: everything the iteration holds at once, every map kept) without and with
every encoding and in-place ReLU the rules allow, and their ratio (``reduction``, Gist's
MFR; ``reduction_without_inplace``: the encodings alone). pooch.csv: ResNet-50 b512 and b640
and VGG-16 b256 on a 16 GB V100, PoocH without and with lossless encodings (the search over
encoding sets of pooch_ext/encodings.py): the smallest budget each reaches, and the plan's
images/s at 16 GB and at budgets between the minimum and the in-core need.

Assumption, stated because the sparse figures follow it: analytic profiles take half of a
ReLU output's elements to be nonzero (the least sparse Gist reports; measured profiles count
them). A decoded map is the full-size float map, except a binarized one: its one-byte mask,
which ReLU's backward reads (hooks/relu_mask.py).

    .venv/bin/python experiments/gist_encodings.py [--networks vgg16:256 ...]
        [--pooch resnet50:512 ...] [--out-dir ...]
"""
from __future__ import annotations

import sys

import pandas as pd
from tqdm import tqdm

import common
from pooch_ext import encodings
from pooch_ext.inplace import inplace_ops
from pooch_ext.policies import get_policy
from pooch_ext.sim.budgets import minimum_budget

OUT = common.RESULTS / "gist"
NETWORKS = (("vgg16", 256), ("alexnet", 2048), ("resnet50", 512), ("small-resnet", 128))
SETTINGS = {"lossless": "lossless", "lossless+dpr": "lossy", "lossless+dpr8": "lossy-fp8"}
POOCH_NETWORKS = (("resnet50", 512), ("resnet50", 640), ("vgg16", 256))
FRACTIONS = (0.0, 0.25, 0.5)
GiB = 2 ** 30


def reduction_rows(networks: list[tuple[str, int]]) -> list[dict]:
    rows = []
    for model, batch in tqdm(networks, desc="footprints", leave=False):
        p = common.profile(model, batch)
        for name, setting in SETTINGS.items():
            table = encodings.candidates(p, setting)
            plain, encoded = encodings.footprint(p, setting)
            without_inplace = encodings.encoded_profile(p, table).incore_peak_bytes
            counts = table["codec"].value_counts()
            rows.append(dict(network=model, batch=batch, setting=name,
                             incore_bytes=plain, encoded_bytes=encoded,
                             reduction=round(plain / encoded, 3),
                             reduction_without_inplace=round(plain / without_inplace, 3),
                             maps=int((p.tensors.kind == "feature_map").sum()),
                             encoded_maps=len(table),
                             **{c: int(counts.get(c, 0)) for c in encodings.CODECS},
                             inplace_relus=len(inplace_ops(p))))
    return rows


def least_budget(p, setting: str) -> tuple[int, int]:
    """(smallest budget without encodings, smallest over the encoding sets PoocH tries)."""
    base = encodings.lossless_base(p)
    sets = encodings.setting_choices(base, setting)
    return minimum_budget(p), min(minimum_budget(encodings.encoded_profile(base, s))
                                  for s in sets)


def _given(plain_profile, plain_plan, classify):
    """``classify`` that hands back ``plain_plan`` for the unencoded profile (already made)."""
    def classify_one(target, **kwargs):
        return plain_plan if target is plain_profile else classify(target, **kwargs)
    return classify_one


def pooch_rows(networks: list[tuple[str, int]], budget: str | None = None,
               fractions: tuple[float, ...] = FRACTIONS) -> list[dict]:
    rows = []
    pooch = get_policy("pooch").classify
    jobs = [(m, b, link) for m, b in networks for link in common.PAPER_LINKS]
    for model, batch, link in tqdm(jobs, desc="pooch", leave=False):
        p = common.profile(model, batch)
        floor, floor_encoded = least_budget(p, "lossless")
        budgets = {budget or "16GB": common.budget_bytes(p, budget)}
        for f in fractions:
            budgets[f"{f:g} of the way"] = int(floor + f * (p.incore_peak_bytes - floor))
        for where, nbytes in budgets.items():
            if nbytes >= p.incore_peak_bytes:
                continue
            plain = pooch(p, nbytes, link)
            _, plan = encodings.classify(p, _given(p, plain, pooch), "lossless",
                                         budget=nbytes, link=link)
            for setting, chosen, least in (("none", plain, floor), ("lossless", plan, floor_encoded)):
                rows.append(dict(network=model, batch=batch, link=link, budget=where,
                                 budget_bytes=nbytes, encodings=setting,
                                 minimum_bytes=least, feasible=bool(chosen.feasible),
                                 iteration_time_s=chosen.iteration_time_s,
                                 images_per_s=batch / chosen.iteration_time_s,
                                 incore_images_per_s=batch / p.incore_time_s,
                                 encoded_maps=len(chosen.encodings),
                                 **chosen.counts))
    return rows


def plot(reduction: pd.DataFrame, path) -> None:
    wide = reduction.pivot(index="network", columns="setting", values="reduction")
    alone = reduction[reduction.setting == "lossless"].set_index("network")
    bars = pd.DataFrame({"binarize + sparse": alone["reduction_without_inplace"],
                         "lossless (+ in-place ReLU)": wide["lossless"],
                         "lossless + DPR (fp16)": wide["lossless+dpr"],
                         "lossless + DPR (fp8)": wide["lossless+dpr8"]})
    ax = bars.plot.bar(figsize=(7, 3.8), rot=0)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhline(1.5, color="gray", lw=0.8, ls="--")
    ax.set_ylabel("in-core footprint / with encodings")
    ax.set_title("Gist's encodings: footprint reduction (analytic, V100)")
    common.save(ax.figure, path)


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__, OUT)
    ap.add_argument("--networks", nargs="+", type=common.case, default=list(NETWORKS),
                    help="model:batch for the footprints (default %(default)s)")
    ap.add_argument("--pooch", nargs="+", type=common.case, default=list(POOCH_NETWORKS),
                    help="model:batch for PoocH with and without (default %(default)s)")
    ap.add_argument("--fractions", nargs="+", type=float, default=list(FRACTIONS),
                    help="budgets as fractions of the way from the smallest to the in-core need "
                         "(default %(default)s)")
    args = ap.parse_args(argv)
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    reduction = pd.DataFrame(reduction_rows(args.networks))
    reduction.to_csv(out / "reduction.csv", index=False)
    plot(reduction, out / "reduction.png")
    table = pd.DataFrame(pooch_rows(args.pooch, args.budget, tuple(args.fractions)))
    table.to_csv(out / "pooch.csv", index=False)
    print(reduction[["network", "batch", "setting", "reduction", "reduction_without_inplace",
                     "encoded_maps", "inplace_relus"]].to_string(index=False))
    wide = table.pivot_table(index=["network", "batch", "link", "budget"], columns="encodings",
                             values="images_per_s").round(1)
    print(wide.to_string())
    least = table.groupby(["network", "batch", "encodings"]).minimum_bytes.first() / GiB
    print(least.round(2).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
