"""The optimizer against the exhaustive grid, and against PiPPy's equal-size split, in one run.

1. Grid: every block cut x every chunk count dividing the batch (2 stages), each a real trial timing the
   pipeline; its speedups use the serial model timed in the same pool, interleaved with the grid.
2. Optimizer: ``search.optimize`` in a fresh study (journal file in a temporary folder).
3. Prints: the grid's best, the trials the optimizer needed to reach >= 97 % of it, and the optimizer's
   best over PiPPy's equal-size plan as measured by the optimizer's own confirmation round.

    python benchmarks/search_efficiency.py                                  # DeiT-S, batch 32
    python benchmarks/search_efficiency.py --model resnet50 --image-size 160 --batch-size 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    import optuna

    from costmodel.profile import divisors
    from pipeline.candidates import find_candidates
    from pipeline.models import build_model, resolve_spec
    from pipeline.plan import SplitPlan, SplitPoint
    from pipeline.pool import StagePool
    from search.optimize import main as optimize

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="deit_small_patch16_224")
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--skip-grid", action="store_true", help="only run the optimizer")
    args = p.parse_args(argv)
    spec = resolve_spec(args.model, batch_size=args.batch_size, image_size=args.image_size)
    cands = find_candidates(build_model(spec), spec)
    chunks = divisors(spec.batch_size)
    t0 = time.perf_counter()
    grid: dict[tuple[str, int], float] = {}
    serial: list[float] = []
    if not args.skip_grid:
        with StagePool(2, threads_per_stage=1) as pool:
            for i, cut in enumerate(cands.cuts):
                for m in chunks:
                    plan = SplitPlan(model=spec, split_points=(SplitPoint(cut),), chunks=m, threads_per_stage=1)
                    # the serial model is timed on every fourth plan: it does not change with the plan
                    # warmup=0: the output check runs the fresh pipeline once first, which warms it up
                    r = pool.run(plan, repeats=args.repeats, warmup=0, serial_all=False, serial=(len(grid) % 4 == 0))
                    if not r.ok:
                        print(f"grid {cut} x {m}: failed: {r.reason}", flush=True)
                        continue
                    serial.extend(r.serial_s)
                    grid[(cut, m)] = statistics.median(r.pipeline_s)
                    print(f"grid {cut:>10} x {m:>2} chunks: pipeline {grid[(cut, m)]:.3f}s", flush=True)
        s = statistics.median(serial)
        best_key = min(grid, key=grid.get)
        grid_best = s / grid[best_key]
        print(f"grid: {len(grid)} plans in {time.perf_counter() - t0:.0f}s; serial {s:.3f}s (median of "
              f"{len(serial)}); best {best_key[0]} x {best_key[1]} chunks = {grid_best:.2f}x")
    with tempfile.TemporaryDirectory() as tmp:
        t1 = time.perf_counter()
        flags = ["--model", args.model, "--batch-size", str(spec.batch_size), "--stages", "2",
                 "--chunks", ",".join(map(str, chunks)), "--trials", str(args.trials), "--repeats", str(args.repeats),
                 "--threads-per-stage", "1", "--storage", f"{tmp}/study.log", "--study-name", "efficiency",
                 "--results-dir", tmp, "--no-progress"]
        if args.image_size:
            flags += ["--image-size", str(args.image_size)]
        code = optimize(flags)
        if code != 0:
            return code
        study = optuna.load_study(study_name="efficiency", storage=optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(f"{tmp}/study.log")))
        measured = [t for t in study.trials if t.user_attrs.get("measured")]
        conf = study.user_attrs["confirmation"]
        best_row = next(r for r in conf["plans"] if r["trial"] == conf["best_trial"])
        pippy = next((r for r in conf["plans"] if "pippy-equal-size" in str(r["source"])), None)
        print(f"optimizer: {len(measured)} measured trials, {len(study.trials)} in all, "
              f"{time.perf_counter() - t1:.0f}s")
        if grid:
            running = 0.0
            reached = None
            for k, t in enumerate(measured, 1):
                if t.value is not None:
                    running = max(running, t.value)
                if reached is None and running >= 0.97 * grid_best:
                    reached = k
            print(f"trials to reach >= 97% of the grid's best ({0.97 * grid_best:.2f}x): "
                  f"{reached if reached else 'not reached'} (best in search {running:.2f}x)")
        print(f"optimizer best (confirmed): {best_row['split_points']} x {best_row['chunks']} chunks = "
              f"{best_row['median']:.2f}x (spread {best_row['spread'][0]:.2f}-{best_row['spread'][1]:.2f})")
        if pippy:
            print(f"PiPPy equal-size (confirmed in the same round): {pippy['split_points']} x {pippy['chunks']} = "
                  f"{pippy['median']:.2f}x -> best / equal-size = {best_row['median'] / pippy['median']:.2f}x")
        print(json.dumps({"grid_best": grid_best if grid else None, "optimizer_best": best_row["median"],
                          "pippy": pippy["median"] if pippy else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
