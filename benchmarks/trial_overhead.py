"""Per-trial overhead of the persistent pool vs a fresh process spawn per trial (DeiT-S, batch 32, 2 stages).

Overhead is the driver's time for a trial minus the trial's own work (the slowest rank's time from
receiving the plan to answering: build, output check, warm-up, timed repeats). For a fresh spawn it also
counts starting the processes (interpreter, torch import, process group) and shutting them down.

    python benchmarks/trial_overhead.py [--trials 3] [--model deit_small_patch16_224]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.models import resolve_spec
from pipeline.pool import StagePool


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="deit_small_patch16_224")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--split-point", default="blocks.6")
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    spec = resolve_spec(args.model, batch_size=args.batch_size)
    plan = SplitPlan(model=spec, split_points=(SplitPoint(args.split_point),), chunks=args.chunks,
                     threads_per_stage=1)
    kw = {"repeats": args.repeats, "warmup": 1, "serial_all": False}

    pooled = []
    t = time.perf_counter()
    with StagePool(2, threads_per_stage=1) as pool:
        start = pool.start_s
        for _ in range(args.trials):
            r = pool.run(plan, **kw)
            assert r.ok, r.reason
            pooled.append((r.wall_s, r.busy_s, r.speedup))
    pooled_total = time.perf_counter() - t

    fresh = []
    for _ in range(args.trials):
        t = time.perf_counter()
        with StagePool(2, threads_per_stage=1) as pool:
            r = pool.run(plan, **kw)
            assert r.ok, r.reason
        fresh.append((time.perf_counter() - t, r.busy_s, r.speedup))

    def report(name: str, rows: list[tuple[float, float, float]]) -> None:
        over = [w - b for w, b, _ in rows]
        share = [o / w for o, (w, _, _) in zip(over, rows)]
        print(f"{name:>12}: trial {statistics.median([w for w, _, _ in rows]):6.2f}s  "
              f"overhead median {statistics.median(over):7.3f}s (min {min(over):.3f}, max {max(over):.3f})  "
              f"= {100 * statistics.median(share):5.2f}% of the trial  "
              f"speedups {', '.join(f'{s:.2f}' for _, _, s in rows)}")

    print(f"{args.model} batch {args.batch_size}, 2 stages x 1 thread, cut {args.split_point}, chunks {args.chunks}, "
          f"{args.trials} trials each, {args.repeats} timed repeats per trial")
    print(f"pool start-up (once): {start:.2f}s; all pooled trials incl. start-up: {pooled_total:.1f}s")
    report("pool", pooled)
    report("fresh spawn", fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
