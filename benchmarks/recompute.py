"""Recomputation per stage, searched with the cuts, against the frameworks' uniform settings (issue 38).

One ``search.optimize --mode train --schedule 1F1B --recompute search`` of an ``hf:llama`` at 4 stages
under a ``--device-memory`` where the frameworks' default rules fit only with recomputation; then the
search's best (cuts + per-stage counts) and each framework's plan as its user would run it (torchtitan's
rule with ``full``, Megatron's with its least uniform ``--recompute-num-layers N``, DeepSpeed's with
every layer checkpointed; none where a plan fits without) re-measured side by side in interleaved
rounds, with each rank's measured peak beside the budget. Target: the best at least 1.15x the best
framework setting that fits, every rank under the budget.

    python benchmarks/recompute.py --out results/recompute                 # the search, then the table
    python benchmarks/recompute.py --out results/recompute --remeasure-only --rounds 4

Needs ``pip install 'pipesplit[peers]'`` (``make install-dev`` installs it) for the frameworks' rules.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RULES = ("torchtitan", "megatron", "deepspeed-parameters")


def _kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {"num_hidden_layers": args.layers, "hidden_size": args.width, "intermediate_size": args.inter,
            "num_attention_heads": args.heads, "num_key_value_heads": args.heads, "vocab_size": args.vocab}


def _search(args: argparse.Namespace, out: Path, storage: str) -> None:
    cmd = [sys.executable, "-m", "search.optimize", "--model", "hf:llama", "--model-kwargs", json.dumps(_kwargs(args)),
           "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size), "--stages", "4", "--mode", "train",
           "--schedule", "1F1B", "--chunks", args.chunks, "--device-memory", args.device_memory,
           "--recompute", "search", "--trials", str(args.trials), "--storage", storage, "--study-name", args.study,
           "--results-dir", str(out), "--no-progress", "--no-artifacts"]
    log = out / "search.log"
    t0 = time.monotonic()
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    print(f"search: rc {rc} in {time.monotonic() - t0:.0f} s (log {log})", flush=True)
    if rc:
        raise SystemExit(f"the search failed: see {log}")


def _plans(storage: str, study_name: str) -> list[tuple[list[str], Any]]:
    """The best and each framework's measured plan (with the recomputation its trial ran)."""
    import optuna

    from pipeline.core.plan import SplitPlan

    study = optuna.load_study(study_name=study_name, storage=storage)
    conf = study.user_attrs.get("confirmation") or {}
    best = conf.get("best_trial")
    if best is None:
        raise SystemExit("the study has no confirmed best: run the search first")
    rows: list[tuple[list[str], Any]] = [(["best"], SplitPlan.from_dict(study.trials[best].user_attrs["plan"]))]
    for t in study.trials:
        roles = [s for s in str(t.user_attrs.get("source")).split("+") if s in RULES]
        if roles and t.user_attrs.get("plan"):
            plan = SplitPlan.from_dict(t.user_attrs["plan"])
            if t.number == best:
                rows[0][0].extend(roles)
            elif all(plan != p for _, p in rows):
                rows.append((roles, plan))
    return rows


def _remeasure(rows: list[tuple[list[str], Any]], rounds: int, repeats: int) -> list[dict[str, Any]]:
    from pipeline.ranks.pool import StagePool
    from pipeline.rounds import interleaved

    plans = [dataclasses.replace(p, threads_per_stage=1) for _, p in rows]
    with StagePool(plans[0].ranks, threads_per_stage=1, quiet=True) as pool:
        runs = interleaved(pool, plans, rounds, repeats=repeats, serial=False)
    out = []
    for i, (roles, plan) in enumerate(rows):
        secs = [t for res in runs.results[i] for t in res.pipeline_s]
        peaks = [max(res.peak_mem_bytes[k] for res in runs.results[i]) for k in range(plan.ranks)] \
            if runs.results[i] and runs.results[i][0].peak_mem_bytes else []
        out.append({"roles": roles, "plan": plan.describe(), "split_points": [p.fqn for p in plan.split_points],
                    "chunks": plan.chunks, "recompute": plan.recompute if isinstance(plan.recompute, str)
                    else list(plan.recompute), "pipeline_s": secs, "throughput": runs.throughputs(i),
                    "peak_mib": [round(b / 2**20) for b in peaks], "failed": runs.failures.get(i)})
    return out


def _table(rows: list[dict[str, Any]], budget_mib: float) -> str:
    best = next((r for r in rows if "best" in r["roles"] and r["pipeline_s"]), None)
    lines = [f"| plan | split points | chunks | recompute | s/step median (min-max) | samples/s | best is x faster "
             f"| peak MiB per rank (budget {budget_mib:.0f}) |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        rc = r["recompute"] if isinstance(r["recompute"], str) else ",".join(map(str, r["recompute"]))
        if not r["pipeline_s"]:
            lines.append(f"| {' = '.join(r['roles'])} | {', '.join(r['split_points'])} | {r['chunks']} | {rc} "
                         f"| failed: {r['failed']} | | | |")
            continue
        med = statistics.median(r["pipeline_s"])
        ratio = med / statistics.median(best["pipeline_s"]) if best else float("nan")
        over = [p for p in r["peak_mib"] if p > budget_mib]
        lines.append(f"| {' = '.join(r['roles'])} | {', '.join(r['split_points'])} | {r['chunks']} | {rc} "
                     f"| {med:.3f} ({min(r['pipeline_s']):.3f}-{max(r['pipeline_s']):.3f}) "
                     f"| {statistics.median(r['throughput']):.2f} | {ratio:.2f} | {', '.join(map(str, r['peak_mib']))}"
                     + (" (over)" if over else "") + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="results/recompute", help="where the search and the figures go")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--inter", type=int, default=2048)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--chunks", default="4",
                   help="chunk counts the search tries (default 4: microbatches of 2, as a user sets one size)")
    p.add_argument("--device-memory", default="1.1GiB", help="each rank's budget (default 1.1GiB)")
    p.add_argument("--trials", type=int, default=8, help="measured trials of the search (default 8)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the re-measurement (default 3)")
    p.add_argument("--repeats", type=int, default=2, help="timed repeats per plan per round (default 2)")
    p.add_argument("--study", default="recompute-s4", help="the study's name")
    p.add_argument("--remeasure-only", action="store_true", help="re-measure the study already in --out")
    args = p.parse_args(argv)
    from pipeline.core.budget import parse_size

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    storage = f"sqlite:///{out / 'studies.db'}"
    if not args.remeasure_only:
        import optuna

        try:
            optuna.delete_study(study_name=args.study, storage=storage)
        except KeyError:
            pass
        _search(args, out, storage)
    rows = _plans(storage, args.study)
    measured = _remeasure(rows, args.rounds, args.repeats)
    table = _table(measured, parse_size(args.device_memory) / 2**20)
    print(f"\n{table}\n", flush=True)
    (out / "recompute.json").write_text(json.dumps({"args": vars(args), "rows": measured}, indent=1))
    (out / "recompute.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
