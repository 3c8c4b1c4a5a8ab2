"""The largest ``hf:llama`` a 4-stage ``search.optimize --trials 6`` completes on this machine (issue 27).

Each size (``--layers`` at a fixed width, fp32) is searched end to end as a user would: ``python -m
search.optimize --stages 4 --trials 6 --device-memory BUDGET`` in a subprocess, one size after another (never
two at once: two cores). Printed per size: the model's parameters against one rank's budget, whether the
search completed and its wall time, every measured plan's peak per rank beside the budget and beside its
prediction, and the search's measured vs predicted throughput (MAPE, Kendall tau).

``--before DIR`` runs the same search in another checkout (a worktree of main before each rank built only its
own stage, with its own ``.venv``) without ``--device-memory``, which that code did not have: there every rank
built the whole model. A size whose whole model times the ranks would not fit this machine's memory is not
run there (it would take the machine down); the line says so.

    python benchmarks/largest_model.py --layers 16 --budget 4.75GiB            # a 13 GiB Llama, 4 x 4.75 GiB
    python benchmarks/largest_model.py --layers 2,4 --budget 2GiB --before ../before
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def kendall_tau(xs: list[float], ys: list[float]) -> float:
    """Kendall's tau-a of two rankings (1: the same order, -1: reversed)."""
    pairs = list(itertools.combinations(range(len(xs)), 2))
    if not pairs:
        return float("nan")
    score = sum((xs[i] - xs[j]) * (ys[i] - ys[j]) > 0 for i, j in pairs) - \
        sum((xs[i] - xs[j]) * (ys[i] - ys[j]) < 0 for i, j in pairs)
    return score / len(pairs)


def model_kwargs(args: argparse.Namespace, layers: int) -> dict[str, int]:
    return {"num_hidden_layers": layers, "hidden_size": args.width, "intermediate_size": args.intermediate,
            "num_attention_heads": args.heads, "num_key_value_heads": args.heads, "vocab_size": args.vocab}


def param_bytes(kw: dict[str, int]) -> int:
    """fp32 bytes of the model's parameters, from the model on meta (nothing allocated)."""
    from pipeline.models.build import build_meta_model, resolve_spec

    meta = build_meta_model(resolve_spec("hf:llama", kwargs=kw, batch_size=1, seq_len=8))
    return sum(p.numel() * 4 for p in meta.module.parameters())


def search(python: str, cwd: Path, kw: dict[str, int], args: argparse.Namespace, budget: str | None,
           out: Path) -> dict[str, Any]:
    """One search as a subprocess: its exit code, wall time, and what its study holds."""
    storage = out / "study.log"
    cmd = [python, "-m", "search.optimize", "--model", "hf:llama", "--model-kwargs", json.dumps(kw),
           "--batch-size", str(args.batch), "--seq-len", str(args.seq), "--stages", str(args.stages),
           "--trials", str(args.trials), "--threads-per-stage", "1", "--no-progress", "--no-artifacts",
           "--storage", str(storage), "--results-dir", str(out), "--profile-dir", str(out / "profiles"),
           *(["--device-memory", budget] if budget else [])]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    wall = time.monotonic() - t0
    (out / "stdout.txt").write_text(proc.stdout + proc.stderr)
    row: dict[str, Any] = {"rc": proc.returncode, "wall_s": wall, "tail": (proc.stdout + proc.stderr)[-600:]}
    if storage.exists():
        try:
            row.update(study_figures(storage))
        except ValueError as e:  # the search stopped before it made its study
            row["why"] = str(e)
    return row


def study_figures(storage: Path) -> dict[str, Any]:
    """Measured vs predicted peaks per rank and throughput over the study's measured plans."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    st = JournalStorage(JournalFileBackend(str(storage)))
    study = optuna.load_study(study_name=None, storage=st)
    plans = []
    for t in study.trials:
        a = t.user_attrs
        if not a.get("measured"):
            if str(a.get("over_memory", "")).startswith("predicted"):
                plans.append({"trial": t.number, "ran": False, "predicted": a.get("predicted_rank_bytes")})
            continue
        plans.append({"trial": t.number, "ran": True, "state": t.state.name, "peaks": a.get("peak_mem_bytes"),
                      "predicted": a.get("predicted_rank_bytes"), "value": a.get("value", a.get("speedup")),
                      "predicted_value": a.get("predicted_value", a.get("predicted_speedup")),
                      "throughput": a.get("throughput"), "chunks": a.get("chunks"),
                      "cuts": a.get("split_points"), "source": a.get("source")})
    paired = [(p["predicted_value"], p["value"]) for p in plans if p.get("value") and p.get("predicted_value")]
    mape = statistics.mean(abs(q - m) / m for q, m in paired) if paired else float("nan")
    tau = kendall_tau([q for q, _ in paired], [m for _, m in paired])
    conf = study.user_attrs.get("confirmation") or {}
    return {"plans": plans, "mape": mape, "tau": tau, "n_paired": len(paired),
            "best_trial": conf.get("best_trial"), "metric": (study.user_attrs.get("config") or {}).get("objective",
                                                                                                        "speedup")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", default="16", help="num_hidden_layers to try, ascending, comma-separated")
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--intermediate", type=int, default=11008)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--trials", type=int, default=6)
    p.add_argument("--budget", default="4.75GiB", help="--device-memory of every rank")
    p.add_argument("--before", default=None, help="a checkout of main before issue 26/27, with its own .venv")
    p.add_argument("--only", choices=("after", "before"), default=None, help="run one of the two checkouts only")
    p.add_argument("--json", default=None, help="also write every figure here")
    p.add_argument("--keep", default=None, metavar="DIR",
                   help="keep each search's results (summary.md, best_split.json, the study) under DIR/<label>-L<layers>")
    args = p.parse_args(argv)
    from pipeline.core.budget import format_size, parse_size

    budget = parse_size(args.budget)
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    rows = []
    for layers in (int(v) for v in args.layers.split(",")):
        kw = model_kwargs(args, layers)
        size = param_bytes(kw)
        print(f"\n== hf:llama, {layers} layers x width {args.width}: {format_size(size)} of fp32 parameters, "
              f"{size / budget:.2f}x one rank's --device-memory {format_size(budget)}", flush=True)
        row: dict[str, Any] = {"layers": layers, "param_bytes": size, "budget": budget}
        for label, checkout in (("after", ROOT), ("before", Path(args.before) if args.before else None)):
            if checkout is None or args.only not in (None, label):
                continue
            if label == "before" and (args.stages + 1) * size > 0.8 * machine:
                print(f"before: not run: each of {args.stages} ranks and the serial profile built the whole model "
                      f"({args.stages + 1} x {format_size(size)} > 80 % of this machine's {format_size(machine)})")
                row[label] = {"rc": None, "why": "whole model per rank does not fit the machine"}
                continue
            with tempfile.TemporaryDirectory(prefix=f"largest-{label}-") as tmp:
                out = Path(args.keep) / f"{label}-L{layers}" if args.keep else Path(tmp)
                out.mkdir(parents=True, exist_ok=True)
                got = search(str(checkout / ".venv" / "bin" / "python"), checkout, kw, args,
                             args.budget if label == "after" else None, out.resolve())
            row[label] = got
            report(label, got, budget)
        rows.append(row)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    return 0


def report(label: str, got: dict[str, Any], budget: int) -> None:
    from pipeline.core.budget import format_size

    ok = got["rc"] == 0
    print(f"{label}: {'completed' if ok else 'FAILED (exit ' + str(got['rc']) + ')'} in {got['wall_s'] / 60:.1f} min",
          flush=True)
    if not ok:
        print("  " + got["tail"].strip().replace("\n", "\n  "))
    for pl in got.get("plans", []):
        if not pl["ran"]:
            print(f"  trial {pl['trial']}: not run, predicted " + ", ".join(format_size(b) for b in pl["predicted"] or []))
            continue
        peaks = ", ".join(format_size(b) for b in pl["peaks"] or [])
        pred = ", ".join(format_size(b) for b in pl["predicted"] or [])
        over = " OVER" if pl["peaks"] and max(pl["peaks"]) > budget else ""
        print(f"  trial {pl['trial']} ({pl['source']}, chunks {pl['chunks']}): peak {peaks} (predicted {pred}) of "
              f"{format_size(budget)}{over}; {got.get('metric')} {pl['value']} (predicted {pl['predicted_value']})")
    if got.get("n_paired"):
        print(f"  measured vs predicted {got['metric']} over {got['n_paired']} plans: MAPE {got['mape']:.1%}, "
              f"Kendall tau {got['tau']:.2f}; best trial {got.get('best_trial')}")


if __name__ == "__main__":
    sys.exit(main())
