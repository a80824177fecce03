"""The figure of a sweep (pooch-ext sweep --plot): iteration time against the budgets or
the links, with the in-core time as the floor no plan goes under."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from pooch_ext.profile import Profile  # noqa: E402
from pooch_ext.units import binary_unit  # noqa: E402


def plot_sweep(table: pd.DataFrame, profile: Profile, path: str | Path, by_budget: bool) -> Path:
    """Write the PNG to ``path`` and return it; points without a plan are crosses on the axis."""
    path = Path(path)
    fig, ax = plt.subplots(figsize=(7, 4))
    ok = table[table.feasible]
    if by_budget:
        unit, scale = binary_unit(float(table.budget_bytes.max()))
        order = ok.sort_values("budget_bytes")
        ax.plot(order.budget_bytes / scale, order.iteration_time_s * 1e3, "o-", label="pooch")
        failed = table[~table.feasible]
        if len(failed):
            ax.plot(failed.budget_bytes / scale, [0] * len(failed), "rx", label="no plan")
        ax.set_xlabel(f"budget ({unit})")
        if table.budget_bytes.max() > 20 * table.budget_bytes.min():
            ax.set_xscale("log")        # (one huge budget would squash the others)
        title = f"link {table.link.iloc[0]}"
    else:
        ax.plot(range(len(table)), [t * 1e3 if f else float("nan") for t, f in
                                    zip(table.iteration_time_s, table.feasible)], "o-",
                label="pooch")
        ax.set_xticks(range(len(table)), table.link)
        ax.set_xlabel("link (as given)")
        title = f"budget {table.budget_bytes.iloc[0] / 2**30:.2f} GiB"
    ax.axhline(profile.incore_time_s * 1e3, color="gray", linestyle="--", label="in-core")
    ax.set_ylabel("iteration (ms)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{profile.meta.get('model', 'profile')}: pooch sweep, {title}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
