"""Per-rank timeline of one measured pipeline run: forward and backward per microbatch, send, receive, idle.

Pure data (no torch): built from a ``TrialResult``'s measured events, checked for consistency, drawn
as a Gantt chart by ``render`` (matplotlib, imported only there).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

KINDS = ("compute", "backward", "weight_grad", "recv", "send", "send_wait")
WORK = ("compute", "backward", "weight_grad")
"""Kinds drawn full height, numbered by microbatch: a stage's own work."""
COLORS = {"compute": "#4c72b0", "backward": "#c44e52", "weight_grad": "#8172b3", "recv": "#dd8452",
          "send": "#55a868", "send_wait": "#8fd19e"}
LABELS = {"compute": "forward (microbatch n)", "backward": "backward (whole, or input grad: B, I)",
          "weight_grad": "weight grad (W, zero-bubble schedules)",
          "recv": "receive (incl. waiting for the previous stage)", "send": "send (post)",
          "send_wait": "send (wait for completion)"}
BACKWARD = {"B": "backward", "I": "backward", "W": "weight_grad"}
"""torch's action letters (``1B0``: stage 1's backward of microbatch 0) and the span kind each is drawn as."""


@dataclass(frozen=True)
class Span:
    """One interval on one rank, seconds from the run's common start."""

    rank: int
    kind: str
    microbatch: int
    """Microbatch index (the n-th span of its kind on the rank), -1 where it is not one microbatch's."""
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start


def recompute_notes(plan: Any) -> tuple[str, ...]:
    """Per rank of a training plan that recomputes, what its backwards recompute (its stages' counts)."""
    rc = getattr(plan, "recompute", "none")
    if plan is None or rc == "none":
        return ()
    out = []
    for r in range(plan.ranks):
        held = plan.rank_stages(r)
        if rc == "full":
            out.append("backward recomputes every block")
            continue
        n = sum(int(rc[s]) for s in held)
        out.append(f"backward recomputes {n} block{'s' if n != 1 else ''}" if n else "")
    return tuple(out)


@dataclass(frozen=True)
class Timeline:
    """Every measured span of one pipeline run, all ranks on one clock."""

    stages: int
    spans: tuple[Span, ...]
    rank_notes: tuple[str, ...] = ()
    """Per rank, what its backwards also run (``recomputes 2 blocks``): drawn under its row's name."""

    @classmethod
    def from_events(cls, compute: Any, comm: Any = (), work: Any = ()) -> Timeline:
        """From per-rank ``(microbatch, start, end)`` compute events, ``(kind, start, end)`` comm events and
        the schedule's ``(action, start, end)`` work events (their backwards and weight grads)."""
        spans: list[Span] = []
        for rank, events in enumerate(work):
            for name, a, b in events:
                m = re.fullmatch(r"\d+([FBIW])(\d+)", str(name))
                if m and m.group(1) in BACKWARD:
                    spans.append(Span(rank, BACKWARD[m.group(1)], int(m.group(2)), float(a), float(b)))
        for rank, events in enumerate(compute):
            spans += [Span(rank, "compute", int(mb), float(a), float(b)) for mb, a, b in events]
        for rank, events in enumerate(comm):
            counts: dict[str, int] = {}
            for kind, a, b in events:
                n = counts.get(kind, 0)
                counts[kind] = n + 1
                spans.append(Span(rank, str(kind), n if kind in ("recv", "send") else -1, float(a), float(b)))
        spans.sort(key=lambda s: (s.rank, s.start, s.end))
        return cls(stages=len(compute), spans=tuple(spans))

    @classmethod
    def from_result(cls, result: Any) -> Timeline:
        got = cls.from_events(result.events, getattr(result, "comm_events", ()), getattr(result, "work_events", ()))
        return replace(got, rank_notes=recompute_notes(getattr(result, "plan", None)))

    def to_dict(self) -> dict[str, Any]:
        return {"stages": self.stages, "spans": [asdict(s) for s in self.spans]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Timeline:
        return cls(stages=int(d["stages"]), spans=tuple(Span(**s) for s in d["spans"]))

    def rank(self, r: int, kind: str | None = None) -> list[Span]:
        return [s for s in self.spans if s.rank == r and (kind is None or s.kind == kind)]

    @property
    def start(self) -> float:
        return min((s.start for s in self.spans), default=0.0)

    @property
    def end(self) -> float:
        return max((s.end for s in self.spans), default=0.0)

    def totals(self, r: int) -> dict[str, float]:
        """Seconds per kind on rank ``r``, plus ``idle``: the rest of the run's span not covered by any."""
        out = {k: sum(s.duration for s in self.rank(r, k)) for k in KINDS}
        covered = _union(self.rank(r))
        out["idle"] = max(0.0, (self.end - self.start) - covered)
        return out

    def problems(self, eps: float = 1e-4) -> list[str]:
        """What would make this timeline wrong: overlapping compute on a rank, microbatches out of order,
        or a stage computing a microbatch before the previous stage finished it."""
        out = []
        for r in range(self.stages):
            comp = self.rank(r, "compute")
            if [s.microbatch for s in comp] != list(range(len(comp))):
                out.append(f"rank {r}: compute spans are not microbatches 0..{len(comp) - 1} in order")
            for a, b in zip(comp, comp[1:]):
                if b.start < a.end - eps:
                    out.append(f"rank {r}: microbatch {b.microbatch} starts before {a.microbatch} ends")
            for s in self.rank(r):
                if s.end < s.start:
                    out.append(f"rank {r}: a {s.kind} span ends before it starts")
            if r:
                prev = {s.microbatch: s for s in self.rank(r - 1, "compute")}
                for s in comp:
                    p = prev.get(s.microbatch)
                    if p is not None and s.start < p.end - eps:
                        out.append(f"rank {r}: microbatch {s.microbatch} starts {p.end - s.start:.4f}s before "
                                   f"rank {r - 1} finished it")
        return out


def _union(spans: list[Span]) -> float:
    total = 0.0
    cur: tuple[float, float] | None = None
    for s in sorted(spans, key=lambda s: s.start):
        if cur is None or s.start > cur[1]:
            if cur is not None:
                total += cur[1] - cur[0]
            cur = (s.start, s.end)
        else:
            cur = (cur[0], max(cur[1], s.end))
    if cur is not None:
        total += cur[1] - cur[0]
    return total


def render(timeline: Timeline, path: str | Path, title: str = "") -> Path:
    """A Gantt chart, one row per rank: compute spans numbered by microbatch, send/recv, idle left white."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    path = Path(path)
    t0 = timeline.start
    scale, unit = (1e3, "ms") if timeline.end - t0 < 2 else (1.0, "s")
    fig, ax = plt.subplots(figsize=(11, 0.9 * timeline.stages + 1.6))
    for s in timeline.spans:
        y = timeline.stages - 1 - s.rank
        h, off = (0.8, 0.0) if s.kind in WORK else (0.3, -0.4 if s.kind == "recv" else 0.1)
        if s.kind in WORK:
            ax.broken_barh([((s.start - t0) * scale, s.duration * scale)], (y - 0.4, h), facecolors=COLORS[s.kind],
                           edgecolors="white", linewidth=0.5)
            if s.duration * scale > (timeline.end - t0) * scale / 60:
                ax.text((s.start - t0 + s.duration / 2) * scale, y, str(s.microbatch), ha="center", va="center",
                        color="white", fontsize=7)
        else:
            ax.broken_barh([((s.start - t0) * scale, s.duration * scale)], (y + off, h),
                           facecolors=COLORS.get(s.kind, "gray"), alpha=0.6)
    ax.set_yticks(range(timeline.stages))
    notes = timeline.rank_notes
    ax.set_yticklabels([f"stage {r}" + (f"\n{notes[r]}" if r < len(notes) and notes[r] else "")
                        for r in reversed(range(timeline.stages))], fontsize=8 if any(notes) else None)
    ax.set_xlabel(f"time since the run started ({unit})")
    ax.set_title(title or "pipeline timeline (measured)", fontsize=10)
    shown = {s.kind for s in timeline.spans} | {"compute", "recv", "send", "send_wait"}
    ax.legend(handles=[Patch(color=COLORS[k], label=LABELS[k]) for k in KINDS if k in shown] + [Patch(facecolor="white",
              edgecolor="gray", label="idle")], loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3, fontsize=7,
              frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    from pipeline.core.atomic import save_figure

    return save_figure(fig, path)
