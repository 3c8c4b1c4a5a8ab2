"""What each rank holds: its peak, its stage's weights and the rest, before and after ranks built only their stage.

Runs ``python -m pipeline.run --out`` for DeiT-S at 2 and 4 stages and an ``hf:llama`` of ~2 GiB of fp32
parameters at 4 stages, in this checkout and (``--before PATH``) in another one, e.g. a worktree of the main
before issue 26 (``git worktree add /tmp/before 91c834c``), and prints one table. A rank's "rest" is its
memory as a timed run starts less its stage's weights (before issue 26 every rank built the whole model, so
its "stage" is the whole model's weights and the rest is what it held beside that).

    python benchmarks/memory.py --before /tmp/before     # ~10 minutes on 2 cores (the llama before: 5 GiB x 4)
    python benchmarks/memory.py --cases deit2,deit4     # this checkout only, DeiT-S only
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

LLAMA = {"num_hidden_layers": 8, "hidden_size": 2048, "intermediate_size": 5504, "num_attention_heads": 16,
         "num_key_value_heads": 16, "vocab_size": 32000}
"""~536M parameters: 2.0 GiB in fp32."""

CASES: dict[str, list[str]] = {
    "deit2": ["--stages", "2", "--policy", "equal-size", "--chunks", "8"],
    "deit4": ["--stages", "4", "--policy", "equal-size", "--chunks", "8"],
    "llama4": ["--model", "hf:llama", "--model-kwargs", json.dumps(LLAMA), "--seq-len", "128", "--batch-size", "8",
               "--stages", "4", "--policy", "uniform", "--chunks", "4"],
}
BUDGET = {"llama4": ["--device-memory", "1.5GiB"]}
"""Given only where the checkout has ``--device-memory`` (after)."""


def run(tree: Path, case: str) -> dict[str, Any]:
    """One ``pipeline.run`` of ``case`` in ``tree``; its result file's figures (or why it failed)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        help_text = subprocess.run([sys.executable, "-m", "pipeline.run", "--help"], cwd=tree, capture_output=True,
                                   text=True, env={**os.environ, "PYTHONPATH": str(tree)}).stdout
        extra = BUDGET.get(case, []) if "--device-memory" in help_text else []
        cmd = [sys.executable, "-m", "pipeline.run", *CASES[case], *extra, "--repeats", "2", "--no-serial-all",
               "--out", str(out)]
        proc = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tree)})
        if proc.returncode != 0 or not out.exists():
            return {"error": (proc.stdout + proc.stderr).strip().splitlines()[-1:]}
        doc = json.loads(out.read_text())
        m = doc["measured"]
        batch = doc["model"]["batch_size"]
        return {"peak": m["peak_mem_bytes"], "base": m["base_mem_bytes"], "stage": m.get("stage_bytes") or [],
                "throughput": batch / statistics.median(m["pipeline_s"]), "speedup": m.get("speedup"),
                "pipeline_s": m["pipeline_s"], "flags": extra}


def whole_bytes(case: str) -> int:
    """The model's fp32 parameter bytes (what every rank held before issue 26)."""
    from pipeline.models.build import build_meta_model, resolve_spec

    args = CASES[case]
    name = args[args.index("--model") + 1] if "--model" in args else "deit_small_patch16_224"
    kwargs = json.loads(args[args.index("--model-kwargs") + 1]) if "--model-kwargs" in args else {}
    seq_len = 128 if name.startswith("hf:") else None
    meta = build_meta_model(resolve_spec(name, kwargs=kwargs, seq_len=seq_len))
    return sum(p.numel() * p.element_size() for p in meta.module.parameters())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, default=None, help="another checkout to measure the same way")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    p.add_argument("--out", type=Path, default=None, help="also write the figures as JSON")
    args = p.parse_args(argv)
    here = Path(__file__).resolve().parents[1]
    trees = [("after", here)] + ([("before", args.before.resolve())] if args.before else [])
    rows: list[dict[str, Any]] = []
    for case in args.cases.split(","):
        whole = whole_bytes(case)
        for label, tree in trees:  # interleaved per case: the machine drifts over tens of minutes
            r = run(tree, case)
            rows.append({"case": case, "tree": label, "whole_bytes": whole, **r})
            print(f"measured {case} {label}", file=sys.stderr, flush=True)
    mib = 2**20
    print(f"{'case':7s} {'tree':6s} {'model MiB':>9s} {'rank':>4s} {'peak MiB':>8s} {'stage MiB':>9s} {'rest MiB':>8s}"
          f" {'samples/s':>9s} {'speedup':>7s}")
    for r in rows:
        if "error" in r:
            print(f"{r['case']:7s} {r['tree']:6s} failed: {r['error']}")
            continue
        peaks, bases = r["peak"], r["base"]
        stages = r["stage"] or [r["whole_bytes"]] * len(peaks)
        for k, (pk, b, s) in enumerate(zip(peaks, bases, stages)):
            thr = f"{r['throughput']:9.2f}" if k == 0 and r.get("throughput") else " " * 9
            sp = f"{r['speedup']:7.2f}" if k == 0 and r.get("speedup") == r.get("speedup") and r.get("speedup") else ""
            model = f"{r['whole_bytes'] / mib:9.0f}" if k == 0 else " " * 9
            print(f"{r['case'] if k == 0 else '':7s} {r['tree'] if k == 0 else '':6s} {model} {k:4d} {pk / mib:8.0f} "
                  f"{s / mib:9.0f} {(b - s) / mib:8.0f} {thr} {sp}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
