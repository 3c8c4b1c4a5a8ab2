"""What summary.md says: the table of the best and the references with their spreads, the budget of trials
and why fewer were measured, the frameworks' line, the Pareto front, and how far memory predictions were."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import optuna

from pipeline.core.ceiling import above_ceiling
from search.judging.confirm import Confirmation
from search.plans.seeds import frameworks_line
from search.trials.coordination import MEASURED, SAMPLER, is_seed, value_of


def _fmt(x: Any, spec: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def summary_rows(study: optuna.Study, confirmation: Confirmation | None) -> list[dict[str, Any]]:
    """One row per reference source and for the declared best: where it cut, predicted and measured."""
    confirmed = {r.trial: r for r in (confirmation.plans if confirmation else ())}
    rows: list[dict[str, Any]] = []
    best_no = confirmation.best_trial if confirmation else None
    tied = set(confirmation.tied_with) if confirmation else set()
    for t in study.get_trials(deepcopy=False):
        if not t.user_attrs.get(MEASURED):
            continue
        if not is_seed(t) and t.number != best_no and t.number not in tied:
            continue
        c = confirmed.get(t.number)
        repeats = [float(v) for v in t.user_attrs.get("repeat_values") or []]
        rows.append({
            "role": "BEST" if t.number == best_no else "TIED" if t.number in tied else "reference",
            "source": str(t.user_attrs.get("source", SAMPLER)), "trial": t.number,
            "split_points": t.user_attrs.get("split_points"),
            "chunks": t.user_attrs.get("chunks"),
            "predicted": t.user_attrs.get("predicted_value", t.user_attrs.get("predicted_speedup")),
            "measured": value_of(t) if t.state == optuna.trial.TrialState.COMPLETE else None,
            "confirmed": c.median if c else None,
            "confirmed_spread": list(c.spread) if c and c.values else None,
            "measured_spread": [min(repeats), max(repeats)] if repeats else None,
            "failed": t.user_attrs.get("fail_reason"),
            "schedule": layout_label(t.user_attrs.get("plan") or {}),
            "peak_mib": [round(b / 2**20) for b in t.user_attrs.get("peak_mem_bytes") or []],
            "predicted_mib": [round(b / 2**20) for b in t.user_attrs.get("predicted_rank_bytes") or []],
        })
    rows.sort(key=lambda r: (r["role"] != "BEST", r["role"] != "TIED", -float(r["confirmed"] or r["measured"] or 0)))
    return rows


def frameworks_summary(confirmation: Confirmation | None, metric: str,
                       unseeded: dict[str, str] | None = None) -> tuple[str, dict[str, Any]]:
    """The best against each framework's default rule, as measured in the same confirmation rounds: a line
    for the summary and the figures for ``best_split.json`` (``measured.frameworks``)."""
    best = confirmation.best if confirmation else None
    peers = confirmation.frameworks if confirmation else {}
    fmt = ".2f" if metric == "speedup" else ".3g"
    data: dict[str, Any] = {}
    grouped: dict[int, list[str]] = {}
    for rule, row in peers.items():
        ratio = best.median / row.median if best and row.median > 0 else math.nan
        data[rule] = {"trial": row.trial, "split_points": list(row.split_points), "chunks": row.chunks,
                      metric: row.median, f"{metric}_spread": list(row.spread), "best_over_it": ratio}
        grouped.setdefault(row.trial, []).append(rule)
    parts = []
    for trial, rules in grouped.items():
        d = data[rules[0]]
        lo, hi = d[f"{metric}_spread"]
        if best is not None and trial == best.trial:
            parts.append(f"the default plan of {', '.join(rules)} itself")
            continue
        parts.append(f"{d['best_over_it']:.2f}x the plan of {', '.join(rules)} ({d[metric]:{fmt}}, spread {lo:{fmt}}-{hi:{fmt}})")
    text = ""
    if best and parts:
        text = (f"Against the frameworks' default rules, in the same interleaved rounds: the best ({best.median:{fmt}}) "
                "is " + ", ".join(parts) + ".")
    if unseeded:
        text += (" " if text else "") + "Frameworks' rules " + frameworks_line(unseeded) + "."
    return text, data


def layout_label(plan: dict[str, Any]) -> str:
    """A plan's schedule, with its stages per rank where more than one (``Interleaved1F1B/V2``) and the
    blocks each stage recomputes where it recomputes any (``1F1B, recompute 2,1,0,0``)."""
    v = int(plan.get("stages_per_rank", 1))
    name = str(plan.get("schedule", "GPipe"))
    label = name if v == 1 else f"{name}/V{v}"
    rc = plan.get("recompute", "none")
    if rc not in (None, "none"):
        label += f", recompute {rc if isinstance(rc, str) else ','.join(map(str, rc))}"
    return label


def _with_spread(value: Any, spread: Any, fmt: str, ceiling: float | None) -> str:
    """A figure with its min-max, flagged where a speedup passes the machine's ceiling (noise, not speed)."""
    text = _fmt(value, fmt)
    if spread and text != "-":
        text += f" ({_fmt(spread[0], fmt)}-{_fmt(spread[1], fmt)})"
    if flag := above_ceiling(value, ceiling):
        text += f" {flag}"
    return text


def summary_table(rows: list[dict[str, Any]], metric: str = "speedup", ceiling: float | None = None) -> str:
    """The summary's table: the best (and the plans tied with it) and each reference, their schedule, figures
    (speedup or throughput in samples/s, as ``metric``, each with its min-max, a speedup over ``ceiling``
    flagged) and peak memory per stage (measured, and predicted where a budget was given)."""
    fmt = ".2f" if metric == "speedup" else ".3g"
    ceiling = ceiling if metric == "speedup" else None
    predicted = any(r.get("predicted_mib") for r in rows)
    head = "speedup" if metric == "speedup" else "samples/s"
    out = [f"| role | source | trial | split points | chunks | schedule | predicted {head} | measured {head} "
           f"| confirmed {head} | peak MiB per stage |" + (" predicted MiB per stage |" if predicted else ""),
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if predicted else "")]
    for r in rows:
        pts = ", ".join(r["split_points"] or [])
        measured = _with_spread(r["measured"], r.get("measured_spread"), fmt, ceiling) if not r["failed"] \
            else f"failed: {r['failed'][:60]}"
        peaks = ", ".join(map(str, r.get("peak_mib") or [])) or "-"
        pred = (" " + (", ".join(map(str, r.get("predicted_mib") or [])) or "-") + " |") if predicted else ""
        confirmed = _with_spread(r["confirmed"], r.get("confirmed_spread"), fmt, ceiling)
        out.append(f"| {r['role']} | {r['source']} | {r['trial']} | {pts} | {r['chunks']} | {r.get('schedule', 'GPipe')} "
                   f"| {_fmt(r['predicted'], fmt)} | {measured} | {confirmed} | {peaks} |{pred}")
    return "\n".join(out)


def pareto_table(study: optuna.Study, metric: str = "speedup") -> str:
    """A two-objective study's Pareto front (the figure up, largest stage's peak memory down), fastest first;
    empty for a one-objective study."""
    if len(study.directions) < 2:
        return ""
    out = [f"Pareto front ({metric} up, the largest stage's peak memory down):", "",
           f"| trial | split points | chunks | schedule | {metric} | largest stage's peak MiB |",
           "| --- | --- | --- | --- | --- | --- |"]
    for t in sorted(study.best_trials, key=lambda t: -t.values[0]):
        pts = ", ".join(t.user_attrs.get("split_points") or [])
        out.append(f"| {t.number} | {pts} | {t.user_attrs.get('chunks')} | {layout_label(t.user_attrs.get('plan') or {})} "
                   f"| {t.values[0]:.2f} | {t.values[1]:.0f} |")
    return "\n".join(out)


def memory_errors(study: optuna.Study) -> str:
    """Predicted vs measured peak per rank over the measured plans, in a sentence (empty before any)."""
    pairs = [(p, q) for t in study.get_trials(deepcopy=False)
             for p, q in zip(t.user_attrs.get("peak_mem_bytes") or [], t.user_attrs.get("predicted_rank_bytes") or [])]
    if not pairs:
        return ""
    errs = sorted(q / p - 1 for p, q in pairs if p > 0)
    return (f" Predicted / measured peak per rank over {len(pairs)} measured ranks: median {errs[len(errs) // 2]:+.0%}, "
            f"from {errs[0]:+.0%} to {errs[-1]:+.0%} (the table shows both per stage).")


def budget_line(c: dict[str, int], asked: int | None, budget_repeats: int | None = None,
                memory_flag: str = "--device-memory", failures: Sequence[tuple[int, str]] = ()) -> str:
    """The search's budget in words: what was asked, what was measured, what failed and why the rest was not."""
    own = c["measured"] - c["seeds"]
    raced = f", {c['raced_out']} of them raced out early" if c.get("raced_out") else ""
    if c.get("over_memory"):
        raced += f", {c['over_memory']} over {memory_flag} (infeasible)"
    failed = c.get("failed", 0)
    named = "; ".join(f"trial {n}: {why[:160]}" for n, why in failures[:3]) + ("; ..." if len(failures) > 3 else "")
    text = (f"{c['measured']} measured trials ({c['seeds']} seeds, {own} the sampler's own{raced})"
            + (f" and {failed} failed ({named})" if failed and named else f" and {failed} failed" if failed else "")
            + (f" of {asked} asked for" if asked is not None else "")
            + f", {c.get('repeats', 0)} timed repeats" + (f" of a budget of {budget_repeats}" if budget_repeats else "")
            + f"; {c['stored']} trials stored in all"
            + (f", from a space of {c['space']} plans." if c.get("space") else "."))
    if asked is not None and c["measured"] + failed < asked:
        if budget_repeats is not None and c.get("repeats", 0) >= budget_repeats:
            text += " The search stopped when its repeat budget was spent."
        elif c.get("unrun_over_memory"):
            text += (f" The search stopped when every plan left was predicted over {memory_flag}: the "
                     f"{c['unrun_over_memory']} plans without a trial were never built; a larger {memory_flag}, "
                     "more stages or a smaller dtype widen the space.")
        elif c.get("space") and c["measured"] + failed + c["pruned"] + c.get("predicted_over", 0) >= c["space"]:
            over = (f", {c['predicted_over']} predicted over {memory_flag} and not run" if c.get("predicted_over")
                    else "")
            text += (f" The space holds only {c['space']} plans ({c['measured']} measured, {c['pruned']} pruned by "
                     f"the cost model{over}): every one was tried, each once.")
        else:
            text += (f" The search stopped short: of the sampler's other proposals, {c['pruned']} were pruned by "
                     "the cost model (predicted figure, corrected by the most optimistic measured/predicted ratio "
                     f"so far, below 97 % of the best measured), {c['infeasible']} were infeasible and "
                     f"{c['duplicates']} repeated a measured plan. Run the same command with --no-prune to measure "
                     "what the cost model pruned.")
    return text
