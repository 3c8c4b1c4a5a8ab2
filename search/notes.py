"""What a person reads first about a trial in optuna-dashboard: a Markdown note per measured trial.

The plan as stage ranges of module names, predicted vs measured speedup, the spread of its repeats,
peak memory per stage and its timeline (the uploaded artifact, shown inline). Saved with
``optuna_dashboard.save_note``; the study gets one too (what was searched, how to read the trials).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from search.report import stage_ranges

__all__ = ["save_study_note", "save_trial_note", "study_note", "trial_note"]


def _x(v: Any) -> str:
    return f"{float(v):.2f}x" if isinstance(v, (int, float)) and v == v else "-"


def _schedule(attrs: Mapping[str, Any]) -> str:
    """The plan's schedule (and V, and training) where it is not the default forward-only GPipe."""
    v = int(attrs.get("stages_per_rank") or 1)
    sched = str(attrs.get("schedule") or "GPipe")
    train = (attrs.get("plan") or {}).get("mode") == "train"
    if sched == "GPipe" and v == 1 and not train:
        return ""
    return f", schedule {sched}" + (f" with {v} stages per rank" if v > 1 else "") + (", training steps" if train else "")


def trial_note(attrs: Mapping[str, Any], names: Sequence[str], *, number: int, state: str,
               timeline_url: str | None = None) -> str:
    """The note of one measured trial from its user attributes."""
    starts = [str(s) for s in attrs.get("split_points", [])]
    lines = [f"## Trial {number}: {state} ({attrs.get('source', '?')})", "",
             f"**Plan**: {attrs.get('chunks', '?')} chunks, cuts at {', '.join(starts) or '-'}"
             + _schedule(attrs), ""]
    lines += [f"- stage {k}: {r}" for k, r in enumerate(stage_ranges(starts, list(names)), 1)]
    spread = attrs.get("speedup_spread") or []
    measured = attrs.get("speedup")
    lines += ["", "| | speedup |", "|---|---|",
              f"| measured (median of {attrs.get('repeats', '?')} repeats) | {_x(measured)} |",
              f"| spread of repeats | {_x(spread[0]) if spread else '-'} .. {_x(spread[-1]) if spread else '-'} |",
              f"| predicted by the cost model | {_x(attrs.get('predicted_speedup'))} |",
              f"| predicted, calibrated to the measured trials | {_x(attrs.get('calibrated_speedup'))} |"]
    peaks = attrs.get("peak_mem_bytes") or []
    if peaks:
        lines += ["", "**Peak memory per stage**: " + ", ".join(f"{p / 2**20:.0f} MiB" for p in peaks)]
    if attrs.get("raced_out"):
        lines += ["", f"**Raced out**: {attrs['raced_out']}"]
    if attrs.get("over_memory"):
        lines += ["", f"**Infeasible**: {attrs['over_memory']}"]
    if attrs.get("prediction"):
        lines += ["", f"**Prediction**: {attrs['prediction']}"]
    if attrs.get("fail_reason"):
        lines += ["", f"**Failed**: {attrs['fail_reason']}"]
    if timeline_url:
        lines += ["", f"![measured timeline]({timeline_url})", "", f"[timeline PNG]({timeline_url})"]
    return "\n".join(lines) + "\n"


def save_trial_note(trial: optuna.Trial, names: Sequence[str], state: str, artifact_id: str | None) -> None:
    """Save ``trial_note`` for a live trial (its timeline link is the dashboard's artifact route)."""
    from optuna_dashboard import save_note

    url = None
    if artifact_id:
        url = f"/artifacts/{trial.study._study_id}/{trial._trial_id}/{artifact_id}"
    save_note(trial, trial_note(trial.user_attrs, names, number=trial.number, state=state, timeline_url=url))


def study_note(config: Mapping[str, Any], space_size: int, ceiling: float | None) -> str:
    return "\n".join([
        f"## pipesplit search: {config.get('model')} on {config.get('stages')} ranks (--stages {config.get('stages')})",
        "",
        f"Every trial is a real {config.get('device')} pipeline run ({config.get('backend')} backend, "
        f"{config.get('schedule')}, {config.get('threads_per_stage')} thread(s) per stage"
        + (f", training steps with {config.get('optimizer')}" if config.get("mode") == "train" else "")
        + "); the space holds "
        f"{space_size} plans ({config.get('granularity')} cuts x chunk counts).",
        "",
        "- **value** is the measured speedup (serial model on one stage's threads / pipeline, median of repeats);",
        "  intermediate values are that median after each repeat (racing: a plan clearly behind stops early).",
        "- **params** name the module each later stage starts at (`cut_1` starts stage 2) and the chunk count.",
        "- Predictions are user attributes only (`predicted_speedup`, `calibrated_speedup`), never values.",
        "- Pruned trials without intermediate values were pruned by the cost model and never ran.",
        *([f"- Ceiling: {ceiling:.2f}x is the most this machine can give this many stages."] if ceiling else []),
    ]) + "\n"


def save_study_note(study: optuna.Study, body: str) -> None:
    from optuna_dashboard import save_note

    save_note(study, body)
