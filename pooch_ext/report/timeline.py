"""Timeline figure: the paper's Figures 7, 10 and 11 as one picture.

Top: a Gantt chart with three lanes, compute (forward, backward, recomputation), D2H
(swap-outs) and H2D (swap-ins); compute stalls (waiting for copies) are red, the runtime's
host work issuing the actions gray. Bottom: device memory while each op runs against the
budget. Large networks have thousands of boxes, so each lane is one ``broken_barh`` call.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from pooch_ext.sim.timeline import Timeline  # noqa: E402
from pooch_ext.units import binary_unit, format_bytes  # noqa: E402

COLORS = {"forward": "#4c72b0", "backward": "#55a868", "update": "#8172b2",
          "recompute": "#dd8452", "d2h": "#ccb974", "h2d": "#64b5cd", "stall": "#c44e52",
          "runtime": "#8c8c8c"}
LANES = ("compute", "D2H", "H2D")


def _bars(starts, ends) -> list[tuple[float, float]]:
    return [(float(a), float(b - a)) for a, b in zip(starts, ends) if b > a]


def plot_timeline(timeline: Timeline, path: str | Path, title: str = "") -> Path:
    """Write the timeline PNG to ``path`` and return it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (gantt, mem) = plt.subplots(2, 1, figsize=(13, 6.5), sharex=True,
                                     gridspec_kw={"height_ratios": [1.2, 1]})
    y = {lane: (2 - k) * 10 for k, lane in enumerate(LANES)}
    ops = timeline.ops
    for phase in ("forward", "backward", "update"):
        sel = ops[ops.phase == phase]
        gantt.broken_barh(_bars(sel.start_s, sel.end_s), (y["compute"], 8),
                          facecolors=COLORS[phase], edgecolor="white", linewidth=0.2)
    rc = timeline.recomputes
    gantt.broken_barh(_bars(rc.start_s, rc.end_s), (y["compute"], 8),
                      facecolors=COLORS["recompute"], edgecolor="white", linewidth=0.2)
    stalled = ops[ops.stall_s > 0]
    stall_end = stalled.start_s - stalled.recompute_s
    gantt.broken_barh(_bars(stall_end - stalled.stall_s, stall_end), (y["compute"], 8),
                      facecolors=COLORS["stall"], hatch="///", edgecolor=COLORS["stall"])
    busy = ops[ops.host_s > 0]       # the runtime issuing the boundary's actions, before
    host_end = busy.start_s - busy.recompute_s - busy.stall_s
    gantt.broken_barh(_bars(host_end - busy.host_s, host_end), (y["compute"], 8),
                      facecolors=COLORS["runtime"])
    for direction, lane in (("d2h", "D2H"), ("h2d", "H2D")):
        sel = timeline.transfers[timeline.transfers.direction == direction]
        gantt.broken_barh(_bars(sel.start_s, sel.end_s), (y[lane], 8),
                          facecolors=COLORS[direction], edgecolor="black", linewidth=0.3)
    gantt.axvline(timeline.forward_end_s, color="gray", linestyle=":", linewidth=1)
    gantt.set_yticks([y[lane] + 4 for lane in LANES], LANES)
    gantt.set_ylim(-2, 30)
    shown = {"forward": True, "backward": True, "update": (ops.phase == "update").any(),
             "recompute": len(rc) > 0, "d2h": True, "h2d": True,
             "stall": len(stalled) > 0, "runtime": len(busy) > 0}    # what the figure draws
    legend = [Patch(color=COLORS[k], label=k) for k, drawn in shown.items() if drawn]
    gantt.legend(handles=legend, ncol=len(legend), loc="lower center", bbox_to_anchor=(0.5, 1.0),
                 fontsize=8, frameon=False)
    fig.suptitle(title or (f"iteration {timeline.iteration_time_s * 1e3:.1f} ms, "
                           f"stalls {timeline.total_stall_s * 1e3:.1f} ms, "
                           f"link {timeline.link}, swap-in {timeline.swap_in_timing}"),
                 fontsize=10)

    memory = timeline.memory
    n = len(ops)
    times = np.r_[ops.start_s.to_numpy(), timeline.iteration_time_s]
    top = max(timeline.budget_bytes, timeline.peak_bytes)
    unit, scale = binary_unit(top)
    mem.step(times, memory.peak_bytes.to_numpy()[: n + 1] / scale, where="post",
             color="#4c72b0", label="device memory (peak within each op)")
    mem.fill_between(times, memory.bytes.to_numpy()[: n + 1] / scale, step="post",
                     color="#4c72b0", alpha=0.25, label="at op boundaries")
    mem.axhline(timeline.budget_bytes / scale, color=COLORS["stall"], linestyle="--",
                label=f"budget {format_bytes(timeline.budget_bytes)}")
    mem.axvline(timeline.forward_end_s, color="gray", linestyle=":", linewidth=1)
    mem.set_ylabel(unit)
    mem.set_xlabel("time (s)")
    mem.set_ylim(0, top / scale * 1.08)
    mem.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
