"""Is a freshly built stage's first timed run slower than its next ones when no check runs first?

The search checks the output on its first timed repeat instead of running the batch once more before
timing (issue 18). This measures the assumption: DeiT-S batch 32, 2 stages x 1 thread, each plan built
twice (the check run first, as ``pipeline.run`` does, and the check on the first repeat, as a search
trial does), 3 timed repeats each; figure: first repeat / median of the other two, per mode.

    python benchmarks/first_repeat.py     # ~7 minutes on 2 cores
"""

from __future__ import annotations

import statistics
import sys

from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.models.build import resolve_spec
from pipeline.ranks.pool import StagePool


def main() -> int:
    spec = resolve_spec("deit_small_patch16_224", batch_size=32)
    rows: dict[bool, list[float]] = {False: [], True: []}
    with StagePool(2, threads_per_stage=1) as pool:
        warm = SplitPlan(model=spec, split_points=(SplitPoint("blocks.6"),), chunks=4, threads_per_stage=1)
        pool.run(warm, repeats=1, warmup=0, serial_all=False)
        for cut in ("blocks.4", "blocks.5", "blocks.6", "blocks.7", "blocks.8"):
            for chunks in (4, 16):
                for first in (True, False):
                    plan = SplitPlan(model=spec, split_points=(SplitPoint(cut),), chunks=chunks, threads_per_stage=1)
                    r = pool.run(plan, repeats=3, warmup=0, serial_all=False, check_first_repeat=first)
                    if not r.ok:
                        raise SystemExit(f"trial failed: {r.reason}")
                    p = r.pipeline_s
                    ratio = p[0] / statistics.median(p[1:])
                    rows[first].append(ratio)
                    print(f"{cut:9s} chunks {chunks:2d} check_first={first!s:5}: serial_s "
                          + " ".join(f"{t:.3f}" for t in r.serial_s) + " pipeline_s " + " ".join(f"{t:.3f}" for t in p)
                          + f"  first/median(rest) {ratio:.3f}", flush=True)
    for first, xs in rows.items():
        print(f"check_first_repeat={first}: first/median(rest) median {statistics.median(xs):.3f} mean "
              f"{statistics.mean(xs):.3f} min {min(xs):.3f} max {max(xs):.3f} n={len(xs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
