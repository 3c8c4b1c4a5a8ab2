"""What a search leaves behind: best_split.json, trials.csv, summary.md (and the printed summary)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import optuna

from pipeline.export import measured as measured_dict
from pipeline.export import provenance, write_json
from pipeline.plan import SplitPlan


def _fmt(x: Any, spec: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def summary_rows(study: optuna.Study, confirmation: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One row per reference source and for the declared best: where it cut, predicted and measured."""
    confirmed = {r["trial"]: r for r in (confirmation or {}).get("plans", [])}
    rows = []
    best_no = (confirmation or {}).get("best_trial")
    for t in study.get_trials(deepcopy=False):
        if not t.user_attrs.get("measured"):
            continue
        src = str(t.user_attrs.get("source", "tpe"))
        if src == "tpe" and t.number != best_no:
            continue
        c = confirmed.get(t.number)
        rows.append({
            "role": "BEST" if t.number == best_no else "reference",
            "source": src, "trial": t.number, "split_points": t.user_attrs.get("split_points"),
            "chunks": t.user_attrs.get("chunks"), "predicted": t.user_attrs.get("predicted_speedup"),
            "measured": t.value if t.state == optuna.trial.TrialState.COMPLETE else None,
            "confirmed": c["median"] if c else None,
            "failed": t.user_attrs.get("fail_reason"),
        })
    rows.sort(key=lambda r: (r["role"] != "BEST", -(r["confirmed"] or r["measured"] or 0)))
    return rows


def summary_table(rows: list[dict[str, Any]]) -> str:
    out = ["| role | source | trial | split points | chunks | predicted | measured | confirmed |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        pts = ", ".join(r["split_points"] or [])
        measured = _fmt(r["measured"]) if not r["failed"] else f"failed: {r['failed'][:60]}"
        out.append(f"| {r['role']} | {r['source']} | {r['trial']} | {pts} | {r['chunks']} | {_fmt(r['predicted'])} "
                   f"| {measured} | {_fmt(r['confirmed'])} |")
    return "\n".join(out)


def export(study: optuna.Study, search: Any, outdir: Path, *, confirmation: dict[str, Any] | None,
           out: str | None, storage_url: str) -> list[Path]:
    outdir.mkdir(parents=True, exist_ok=True)
    paths = []
    best_no = (confirmation or {}).get("best_trial")
    if best_no is None:
        fallback = search.best_measured()
        best_no = fallback.number if fallback else None
    if best_no is not None:
        t = study.trials[best_no]
        plan = SplitPlan.from_dict(t.user_attrs["plan"])
        result = search.results.get(-1) if confirmation and confirmation.get("best_trial") == best_no else None
        result = result or search.results.get(best_no)
        meas = measured_dict(result) if result is not None else {
            "ok": True, "speedup": t.value, "speedup_spread": t.user_attrs.get("speedup_spread"),
            "serial_s": t.user_attrs.get("serial_s"), "pipeline_s": t.user_attrs.get("pipeline_s"),
            "stage_compute_s": t.user_attrs.get("stage_compute_s"), "stage_comm_s": t.user_attrs.get("stage_comm_s"),
            "boundary_bytes": t.user_attrs.get("boundary_bytes"), "max_abs_diff": t.user_attrs.get("max_abs_diff")}
        row = next((r for r in (confirmation or {}).get("plans", []) if r["trial"] == best_no), None)
        if row and row["speedups"]:
            meas["speedup"] = row["median"]
            meas["speedup_spread"] = row["spread"]
            meas["confirmation_speedups"] = row["speedups"]
        meas["search_speedup"] = t.value
        meas["confirmed"] = bool(row and row["speedups"])
        predicted = {k: t.user_attrs.get(a) for k, a in
                     (("speedup", "predicted_speedup"), ("makespan_s", "predicted_s"),
                      ("bubble_fraction", "predicted_bubble"))}
        doc = {**plan.to_dict(), "measured": meas, "predicted": predicted,
               "provenance": provenance(study=study.study_name, trial=best_no, storage=storage_url,
                                        source=t.user_attrs.get("source"), command="search.optimize")}
        best_path = Path(out) if out else outdir / "best_split.json"
        write_json(best_path, doc)
        paths.append(best_path)
    df = study.trials_dataframe(attrs=("number", "value", "state", "params", "user_attrs", "datetime_start",
                                       "duration"))
    csv = outdir / "trials.csv"
    tmp = csv.with_suffix(".csv.tmp")
    df.to_csv(tmp, index=False)
    tmp.replace(csv)
    paths.append(csv)
    rows = summary_rows(study, confirmation)
    table = summary_table(rows)
    measured_n = sum(1 for t in study.trials if t.user_attrs.get("measured"))
    text = (f"# {study.study_name}\n\n{measured_n} measured trials, {len(study.trials)} in all "
            f"(the rest were pruned by the cost model, infeasible, or repeats of a measured plan).\n"
            "Speedup = serial model on one stage's threads / pipeline, median over repeats; "
            "'confirmed' is the median of the interleaved confirmation round.\n\n" + table + "\n")
    (outdir / "summary.md").write_text(text)
    paths.append(outdir / "summary.md")
    print(table)
    return paths


def timeline_runs(confirmation: dict[str, Any] | None) -> list[tuple[str, int, Any, dict[str, Any]]]:
    """(role, trial, Timeline, detail) of the confirmed best plan and PiPPy's equal-size plan, from the
    confirmation round as kept in the study (``search.sweep`` reads the same)."""
    from pipeline.timeline import Timeline

    plans = (confirmation or {}).get("plans", [])
    pippy = next((r["trial"] for r in plans if "pippy-equal-size" in str(r["source"])), None)
    out = []
    for role, number in (("best", (confirmation or {}).get("best_trial")), ("pippy", pippy)):
        row = next((r for r in plans if r["trial"] == number), None)
        detail = (row or {}).get("detail") or {}
        if number is not None and detail.get("timeline"):
            out.append((role, number, Timeline.from_dict(detail["timeline"]), detail))
    return out


def export_timelines(study: optuna.Study, outdir: Path, confirmation: dict[str, Any] | None,
                     artifacts: Any = None) -> list[Path]:
    """Measured Gantt charts of the confirmed best plan and of PiPPy's equal-size plan (PNG + spans JSON),
    uploaded to the study as artifacts when a store is given."""
    from pipeline.timeline import render

    paths: list[Path] = []
    spans: dict[str, Any] = {}
    for role, number, tl, detail in timeline_runs(confirmation):
        plan = SplitPlan.from_dict(detail["plan"])
        label = "best plan" if role == "best" else "PiPPy equal-size"
        path = render(tl, outdir / f"timeline_{role}.png",
                      title=f"{label} (trial {number}): {plan.describe()} - {detail['speedup']:.2f}x")
        spans[role] = {"trial": number, **tl.to_dict()}
        paths.append(path)
        if artifacts is not None:
            from optuna.artifacts import upload_artifact

            upload_artifact(artifact_store=artifacts, file_path=str(path), study_or_trial=study, mimetype="image/png")
    if spans:
        write_json(outdir / "timelines.json", spans)
        paths.append(outdir / "timelines.json")
    return paths
