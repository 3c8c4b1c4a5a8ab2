"""What a trial costs besides its timed repeats, and what the persistent pool saves over a fresh spawn.

Two figures (DeiT-S, batch 32, 2 stages x 1 thread by default):

1. **Fixed cost of a search trial**: everything but the timed repeats (build, output check, warm-up, the
   driver), as a share of the trial's wall time, from each trial's ``TrialResult.breakdown``. A search
   trial times 2 repeats of serial | pipeline (no serial on all threads). "before" builds every stage with
   a fresh trace and runs the batch once more for the output check (pipesplit until issue 18); "after"
   builds from the worker's cached export and checks the first timed repeat's output. Each trial cuts at
   a different block (a search rarely measures a plan twice), the two modes interleaved. It also checks
   that a fresh stage's first timed repeat is not slower than its second when no check runs first (the
   ratio first / second over the "after" trials).
2. **Driver overhead**: the driver's time outside the ranks' own work, pooled vs a fresh process spawn
   per trial (``--spawn``; the spawn figure includes starting the processes and the process group).
3. **Whole searches** (``--search DIR [DIR ...]``): ``search.optimize`` run to the end in each checkout
   (this one, and a ``git worktree`` of an older main, say), one after the other, each in a fresh results,
   storage and profile folder: its wall time, the plans it measured (and failed), the share of the measured
   trials' wall time spent timing, and per trial where the rest went (build, check, warm-up) and how many
   of its stage's bytes each rank reused from the trial before. ``--search-args`` are the search's flags
   (default: what ``make optimize`` runs).

    python benchmarks/trial_overhead.py [--chunks 4 16] [--cuts blocks.4 blocks.5 ...] [--spawn]
    python benchmarks/trial_overhead.py --search /tmp/before . [--search-args "--stages 4"]

4. **Pool start** (``--pool-start``): a pool of 2 and of 4 workers started and restarted three times in one
   process, its workers spawned afresh and forked from the preloaded forkserver, the two alternating.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.core.result import TrialResult
from pipeline.models.build import resolve_spec
from pipeline.ranks.pool import StagePool

MODES = {"before": {"cached_trace": False, "check_first_repeat": False},
         "after": {"cached_trace": True, "check_first_repeat": True}}


def _parts(rows: list[TrialResult]) -> str:
    bs = [r.breakdown for r in rows if r.breakdown is not None]

    def med(name: str) -> float:
        return float(statistics.median(getattr(b, name) for b in bs))

    share = statistics.median(b.fixed_s / b.total_s for b in bs)
    return (f"fixed cost {share:5.1%} of the trial (min {min(b.fixed_s / b.total_s for b in bs):.1%}, "
            f"max {max(b.fixed_s / b.total_s for b in bs):.1%}); medians: trial {med('total_s'):.2f}s = build "
            f"{med('build_s'):.2f}s + check {med('check_s'):.2f}s + warm-up {med('warmup_s'):.2f}s + timed "
            f"{med('timed_s'):.2f}s + other {med('other_s'):.2f}s + driver {med('driver_s'):.3f}s")


def fixed_cost(pool: StagePool, spec: object, cuts: list[str], chunks: list[int], repeats: int) -> None:
    rows: dict[tuple[str, int], list[TrialResult]] = {(m, c): [] for m in MODES for c in chunks}
    firsts: list[float] = []
    for c in chunks:
        for k, cut in enumerate(cuts):
            order = list(MODES) if k % 2 == 0 else list(reversed(MODES))
            for mode in order:
                plan = SplitPlan(model=spec, split_points=(SplitPoint(cut),), chunks=c,  # type: ignore[arg-type]
                                 threads_per_stage=1)
                r = pool.run(plan, repeats=repeats, warmup=0, serial_all=False, **MODES[mode])  # type: ignore[arg-type]
                if not r.ok:
                    raise SystemExit(f"trial failed: {r.reason}")
                rows[(mode, c)].append(r)
                if mode == "after" and len(r.pipeline_s) >= 2:
                    firsts.append(r.pipeline_s[0] / r.pipeline_s[1])
                print(f"  {mode:>6} chunks {c:2d} cut {cut:<9} {r.speedup:.2f}x  {r.breakdown.describe() if r.breakdown else ''}",
                      flush=True)
    for (mode, c), rs in rows.items():
        print(f"{mode:>6}, chunks {c:2d}, {len(rs)} trials: {_parts(rs)}")
    if firsts:
        print(f"first / second timed pipeline repeat with the check on the first ('after'): median "
              f"{statistics.median(firsts):.3f} (min {min(firsts):.3f}, max {max(firsts):.3f}, n={len(firsts)})")


def spawn_overhead(spec: object, cut: str, chunks: int, trials: int, repeats: int) -> None:
    plan = SplitPlan(model=spec, split_points=(SplitPoint(cut),), chunks=chunks,  # type: ignore[arg-type]
                     threads_per_stage=1)
    kw = {"repeats": repeats, "warmup": 0, "serial_all": False}
    pooled, fresh = [], []
    with StagePool(2, threads_per_stage=1) as pool:
        for _ in range(trials):
            r = pool.run(plan, **kw)  # type: ignore[arg-type]
            pooled.append((r.wall_s, r.wall_s - r.busy_s))
    for _ in range(trials):
        t = time.perf_counter()
        with StagePool(2, threads_per_stage=1) as pool:
            r = pool.run(plan, **kw)  # type: ignore[arg-type]
        wall = time.perf_counter() - t
        fresh.append((wall, wall - r.busy_s))
    for name, rows in (("pool", pooled), ("fresh spawn", fresh)):
        over = [o for _, o in rows]
        print(f"driver overhead, {name:>11}: median {statistics.median(over):7.3f}s = "
              f"{statistics.median(o / w for w, o in rows):6.2%} of the trial (min {min(over):.3f}, max {max(over):.3f})")


def whole_search(checkout: str, search_args: str) -> None:
    """One whole ``search.optimize`` in ``checkout`` (this interpreter, the checkout's code first on the path),
    then what its measured trials spent their time on."""
    import os
    import shlex
    import subprocess
    import tempfile
    from pathlib import Path

    import optuna

    root = Path(checkout).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        storage = f"sqlite:///{tmp}/optuna.db"
        cmd = [sys.executable, "-m", "search.optimize", *shlex.split(search_args), "--storage", storage,
               "--results-dir", f"{tmp}/results", "--profile-dir", f"{tmp}/profiles", "--no-progress",
               "--study-name", "overhead"]
        t = time.perf_counter()
        run = subprocess.run(cmd, cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True,
                             text=True)
        wall = time.perf_counter() - t
        if run.returncode != 0:
            print(f"{root}: search.optimize failed ({run.returncode}): {run.stderr.strip().splitlines()[-1:]}")
            return
        study = optuna.load_study(study_name="overhead", storage=storage)
        trials = [t for t in study.get_trials(deepcopy=False)
                  if t.user_attrs.get("measured") and isinstance(t.user_attrs.get("breakdown"), dict)]
        failed = sum(1 for t in trials if t.state == optuna.trial.TrialState.FAIL)
        b = {k: sum(t.user_attrs["breakdown"].get(k, 0.0) for t in trials)
             for k in ("build_s", "check_s", "warmup_s", "timed_s", "other_s", "driver_s")}
        total = sum(b.values())
        print(f"{root}: {wall / 60:.1f} min, {len(trials) - failed} plans measured, {failed} failed; the measured "
              f"trials spent {b['timed_s'] / total:.0%} of their {total:.0f} s timing (build {b['build_s']:.0f} s, "
              f"check {b['check_s']:.0f} s, warm-up {b['warmup_s']:.0f} s, other {b['other_s']:.0f} s, "
              f"driver {b['driver_s']:.0f} s); {b['timed_s'] / wall:.0%} of the search's wall time was timed repeats")
        for t in trials:
            d = t.user_attrs["breakdown"]
            reused = t.user_attrs.get("reused_bytes")
            stage = t.user_attrs.get("stage_bytes") or []
            share = (f", reused {sum(reused) / 2**20:.0f} of {sum(stage) / 2**20:.0f} MiB of its stages"
                     if reused is not None and stage else "")
            print(f"  trial {t.number:2d} {t.state.name:8s} build {d['build_s']:6.2f}s check {d['check_s']:6.2f}s "
                  f"warm-up {d['warmup_s']:5.2f}s timed {d['timed_s']:6.2f}s{share}")


def pool_start(stages: int, rounds: int = 3) -> str:
    """Seconds to start a pool, then to restart it, ``rounds`` times in this process."""
    out = []
    for _ in range(rounds):
        with StagePool(stages, threads_per_stage=1, quiet=True) as pool:
            started = pool.start_s  # restart() starts the pool again and overwrites it
            t = time.perf_counter()
            pool.restart()
            out.append(f"start {started:.2f}s restart {time.perf_counter() - t:.2f}s")
    return "; ".join(out)


def pool_starts() -> None:
    """Each start method in its own process (a forkserver lives as long as the process that started it)."""
    import os
    import subprocess

    code = "import sys; from benchmarks.trial_overhead import pool_start; print(pool_start(int(sys.argv[1])))"
    for method in ("spawn", "forkserver", "spawn", "forkserver"):
        for stages in (2, 4):
            run = subprocess.run([sys.executable, "-c", code, str(stages)], capture_output=True, text=True,
                                 env={**os.environ, "PIPESPLIT_START": method})
            print(f"{method:10s} {stages} workers: {run.stdout.strip() or run.stderr.strip()[-200:]}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="deit_small_patch16_224")
    p.add_argument("--model-kwargs", default=None, help="JSON kwargs for the model (a tiny model, say)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--chunks", type=int, nargs="+", default=[4, 16])
    p.add_argument("--cuts", nargs="+", default=["blocks.4", "blocks.5", "blocks.6", "blocks.7", "blocks.8"])
    p.add_argument("--repeats", type=int, default=2, help="timed repeats per trial (a search trial's base: 2)")
    p.add_argument("--spawn", action="store_true", help="also the pooled vs fresh-spawn driver overhead")
    p.add_argument("--spawn-trials", type=int, default=3)
    p.add_argument("--search", nargs="+", metavar="DIR", help="run a whole search.optimize in each checkout instead")
    p.add_argument("--search-args", default="--stages 4", help="the search's flags (default: make optimize's)")
    p.add_argument("--pool-start", action="store_true", help="only the pool start and restart times, spawn vs forkserver")
    args = p.parse_args(argv)
    if args.pool_start:
        pool_starts()
        return 0
    if args.search:
        for checkout in args.search:
            whole_search(checkout, args.search_args)
        return 0
    import json

    spec = resolve_spec(args.model, batch_size=args.batch_size,
                        kwargs=json.loads(args.model_kwargs) if args.model_kwargs else None)
    print(f"{args.model} batch {args.batch_size}, 2 stages x 1 thread, cuts {' '.join(args.cuts)}, chunks "
          f"{' '.join(map(str, args.chunks))}, {args.repeats} timed repeats per trial")
    with StagePool(2, threads_per_stage=1) as pool:
        t = time.perf_counter()
        warm = SplitPlan(model=spec, split_points=(SplitPoint(args.cuts[0]),), chunks=args.chunks[0],
                         threads_per_stage=1)
        r = pool.run(warm, repeats=1, warmup=0, serial_all=False)  # the model, its reference output, warm serial
        print(f"pool start-up {pool.start_s:.1f}s; first trial (model build, reference, serial warm-up, the "
              f"first export) {time.perf_counter() - t:.1f}s: {r.breakdown.describe() if r.breakdown else r.reason}")
        fixed_cost(pool, spec, args.cuts, args.chunks, args.repeats)
    if args.spawn:
        spawn_overhead(spec, args.cuts[0], args.chunks[0], args.spawn_trials, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
