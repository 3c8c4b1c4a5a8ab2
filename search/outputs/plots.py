"""The sweep's pictures (matplotlib PNG): speedup vs stages, predicted vs measured, compute vs communication."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.core.atomic import save_figure
from pipeline.stage.timeline import COLORS, Timeline
from search.trials.report import POLICY_ORDER, PolicyRow


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def speedup_vs_stages(rows: list[PolicyRow], path: str | Path, figure: str = "speedup") -> Path:
    """One line per policy (median and min-max spread), the optimizer's best, and the ideal S-fold line (a
    throughput sweep, ``figure="throughput"``, has no ideal: samples/s on the y axis)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    counts = sorted({r.stages for r in rows})
    series: dict[str, list[PolicyRow]] = {}
    for r in rows:
        for p in r.policies:
            series.setdefault(p, []).append(r)
        if r.best:
            series.setdefault("optimizer best", []).append(r)
    names = [n for n in POLICY_ORDER if n in series] + [n for n in series if n not in POLICY_ORDER]
    for name in names:
        rs = sorted(series[name], key=lambda r: r.stages)
        xs = [r.stages for r in rs]
        ys = [r.measured for r in rs]
        err = [[y - r.spread[0] for y, r in zip(ys, rs)], [r.spread[1] - y for y, r in zip(ys, rs)]]
        style = {"linewidth": 2.5, "color": "black"} if name == "optimizer best" else {"linewidth": 1.2}
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=name, **style)
    if figure == "speedup":
        ax.plot(counts, counts, "--", color="gray", label="ideal (S-fold)")
    ax.set_xticks(counts)
    ax.set_xlabel("pipeline stages")
    ax.set_ylabel("speedup over the serial model (measured)" if figure == "speedup" else "throughput, samples/s (measured)")
    ax.set_title(f"{figure} vs stages, per split policy", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


def predicted_vs_measured(points: list[tuple[int, float, float]], path: str | Path,
                          ceilings: dict[int, float] | None = None, figure: str = "speedup") -> Path:
    """Every measured trial the cost model priced: (stages, predicted, measured), with the y = x line and,
    per stage count, the machine's ceiling (the most speedup its cores can give), which no point may pass."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 5.5))
    counts = sorted({s for s, _, _ in points})
    colors = {}
    for s in counts:
        xs = [p for st, p, _ in points if st == s]
        ys = [m for st, _, m in points if st == s]
        colors[s] = ax.scatter(xs, ys, label=f"{s} stages", alpha=0.75).get_facecolor()[0]
    vals = [v for _, p, m in points for v in (p, m)] + list((ceilings or {}).values()) or [0.0, 1.0]
    lo, hi = min(vals) * 0.9, max(vals) * 1.1
    ax.plot([lo, hi], [lo, hi], "--", color="gray", label="measured = predicted")
    for s, c in sorted((ceilings or {}).items()):
        ax.axvline(c, color=colors.get(s, "black"), linestyle=":", linewidth=1.2, label=f"ceiling, {s} stages ({c:.2f}x)")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(f"predicted {figure} (cost model)")
    ax.set_ylabel(f"measured {figure} (median of the trial)")
    ax.set_title("cost model vs real runs, every measured trial", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def compute_comm(timelines: dict[str, Timeline], path: str | Path) -> Path:
    """Per stage, stacked seconds of compute, receive (incl. waiting), send and idle, for each labelled run."""
    plt = _plt()
    labels = list(timelines)
    fig, axes = plt.subplots(1, max(1, len(labels)), figsize=(3.2 * max(1, len(labels)) + 1, 4.2), squeeze=False,
                             sharey=False)
    kinds = [("compute", COLORS["compute"]), ("recv", COLORS["recv"]), ("send", COLORS["send"]),
             ("send_wait", COLORS["send_wait"]), ("idle", "#dddddd")]
    names = {"compute": "compute", "recv": "receive (incl. waiting)", "send": "send (post)",
             "send_wait": "send wait (next stage busy)", "idle": "idle"}
    for ax, label in zip(axes[0], labels):
        tl = timelines[label]
        totals = [tl.totals(r) for r in range(tl.stages)]
        bottom = [0.0] * tl.stages
        for kind, color in kinds:
            vals = [t[kind] * 1e3 for t in totals]
            ax.bar(range(tl.stages), vals, bottom=bottom, color=color, label=names[kind])
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_xticks(range(tl.stages))
        ax.set_xticklabels([f"s{r}" for r in range(tl.stages)])
        ax.set_title(label, fontsize=8)
        ax.set_ylabel("ms in one batch")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("per-stage compute vs communication (measured)", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)
