"""The search's best against what torchtitan, Megatron-Core and DeepSpeed split by default, and PiPPy's split.

For each stage count and mode, a whole ``search.optimize`` run (whose seeds include each framework's
default rule, computed by that framework's own code: ``pipeline.peers``), then the confirmation round's
plans (the best, PiPPy's, each framework's default) re-measured side by side in interleaved rounds: the
pipeline's own seconds per batch and throughput (median, min-max over every repeat of every round), and
the peak memory of each stage. A language model whose head matters: ``hf:llama`` with a 64k vocabulary
at a small width.

    python benchmarks/peers.py --out results/peers            # 2 and 4 stages, inference and 1F1B training
    python benchmarks/peers.py --stages 4 --modes train --trials 10 --rounds 4

Needs ``pip install 'pipesplit[peers]'`` (``make install-dev`` installs it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _search(args: argparse.Namespace, stages: int, mode: str, out: Path) -> Path:
    """Run one whole search as its user would, its output in ``out``; the study's storage."""
    kwargs = {"num_hidden_layers": args.layers, "hidden_size": args.width, "intermediate_size": args.inter,
              "num_attention_heads": args.heads, "num_key_value_heads": args.heads, "vocab_size": args.vocab}
    study = f"peers-s{stages}-{mode}"
    storage = f"sqlite:///{out / 'studies.db'}"
    cmd = [sys.executable, "-m", "search.optimize", "--model", "hf:llama", "--model-kwargs", json.dumps(kwargs),
           "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size), "--stages", str(stages),
           "--mode", mode, "--trials", str(args.trials), "--storage", storage, "--study-name", study,
           "--results-dir", str(out), "--no-progress", "--no-artifacts"]
    if mode == "train":
        cmd += ["--schedule", "1F1B"]
    log = out / f"search-s{stages}-{mode}.log"
    t0 = time.monotonic()
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    print(f"search {stages} stages {mode}: rc {rc} in {time.monotonic() - t0:.0f} s (log {log})", flush=True)
    if rc:
        raise SystemExit(f"the search failed: see {log}")
    return out / study


def _fresh(storage: str, name: str) -> None:
    """A case searched again starts a new study (an old one would be resumed, its trials counted)."""
    import optuna

    try:
        optuna.delete_study(study_name=name, storage=storage)
    except KeyError:
        pass


def _remeasure(storage: str, study_name: str, rounds: int, repeats: int) -> list[dict[str, Any]]:
    import optuna

    from pipeline.core.plan import SplitPlan
    from pipeline.ranks.pool import StagePool
    from pipeline.rounds import interleaved

    study = optuna.load_study(study_name=study_name, storage=storage)
    conf = study.user_attrs.get("confirmation") or {}
    best = conf.get("best_trial")
    rows = []
    for r in conf.get("plans", []):
        roles = [s for s in str(r["source"]).split("+") if s in ("pippy-equal-size", "torchtitan", "megatron",
                                                                 "deepspeed-parameters")]
        if r["trial"] == best:
            roles.insert(0, "best")
        if roles:
            rows.append({"roles": roles, "plan": SplitPlan.from_dict(study.trials[r["trial"]].user_attrs["plan"]),
                         "trial": r["trial"]})
    plans = [r["plan"] for r in rows]
    with StagePool(plans[0].ranks, threads_per_stage=plans[0].threads_per_stage, quiet=True) as pool:
        runs = interleaved(pool, plans, rounds, repeats=repeats, serial=False)
    out = []
    for i, r in enumerate(rows):
        secs = [t for res in runs.results[i] for t in res.pipeline_s]
        tput = runs.throughputs(i)
        peaks = [max(res.peak_mem_bytes[k] for res in runs.results[i]) for k in range(len(r["plan"].split_points) + 1)] \
            if runs.results[i] and runs.results[i][0].peak_mem_bytes else []
        out.append({"roles": r["roles"], "trial": r["trial"], "plan": r["plan"].describe(),
                    "split_points": [p.fqn for p in r["plan"].split_points], "chunks": r["plan"].chunks,
                    "pipeline_s": secs, "throughput": tput, "peak_mib": [round(b / 2**20) for b in peaks],
                    "failed": runs.failures.get(i)})
    return out


def _table(rows: list[dict[str, Any]]) -> str:
    best = next((r for r in rows if "best" in r["roles"] and r["pipeline_s"]), None)
    lines = ["| plan | split points | chunks | pipeline s/batch median (min-max) | samples/s median | best is x faster "
             "| peak MiB per stage |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if not r["pipeline_s"]:
            lines.append(f"| {' = '.join(r['roles'])} | {', '.join(r['split_points'])} | {r['chunks']} "
                         f"| failed: {r['failed']} | | | |")
            continue
        med = statistics.median(r["pipeline_s"])
        ratio = med / statistics.median(best["pipeline_s"]) if best else float("nan")
        lines.append(f"| {' = '.join(r['roles'])} | {', '.join(r['split_points'])} | {r['chunks']} "
                     f"| {med:.3f} ({min(r['pipeline_s']):.3f}-{max(r['pipeline_s']):.3f}) "
                     f"| {statistics.median(r['throughput']):.2f} | {ratio:.2f} | {', '.join(map(str, r['peak_mib']))} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="results/peers", help="where the searches and the figures go")
    p.add_argument("--stages", default="2,4", help="stage counts (default 2,4)")
    p.add_argument("--modes", default="infer,train", help="infer and/or train (1F1B) (default both)")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--inter", type=int, default=1376)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=64000)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--trials", type=int, default=8, help="measured trials per search (default 8)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the re-measurement (default 3)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per plan per round (default 3)")
    p.add_argument("--remeasure-only", action="store_true", help="re-measure the studies already in --out")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    storage = f"sqlite:///{out / 'studies.db'}"
    saved = out / "peers.json"
    report: dict[str, Any] = json.loads(saved.read_text()) if saved.exists() else {"cases": {}}
    report["args"] = vars(args)  # the cases of an earlier run (other stage counts or modes) are kept
    for stages in (int(s) for s in args.stages.split(",")):
        for mode in args.modes.split(","):
            if not args.remeasure_only:
                _fresh(storage, f"peers-s{stages}-{mode}")
                _search(args, stages, mode, out)
            rows = _remeasure(storage, f"peers-s{stages}-{mode}", args.rounds, args.repeats)
            report["cases"][f"s{stages}-{mode}"] = rows
            print(f"\n## {stages} stages, {mode}\n\n{_table(rows)}\n", flush=True)
            (out / "peers.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
