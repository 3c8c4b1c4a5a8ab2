"""``python -m costmodel.validate``: does the cost model rank and time real pipelines right?

Runs a grid of real trials on one stage-worker pool (cuts x chunk counts, in interleaved rounds),
predicts each with the simulator from the model's profile, and prints predicted vs measured pipeline
seconds and speedup per plan (the serial model is timed beside every repeat, as in a search), the mean
absolute percentage error and Kendall's tau between the two orderings, and how well the measurement
ranks the plans against itself (one repeat against another): the noise ceiling for a single repeat.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from costmodel.calibrate import TrialRows, fit, trial_rows
from costmodel.footprint import rank_runtime_bytes
from costmodel.simulate import simulate
from costmodel.stats import kendall_tau, mape
from costmodel.types import Profile
from pipeline.core.errors import PipesplitError


def _grid_cuts(n_segments: int, stages: int, count: int) -> list[list[int]]:
    """Evenly spread cut sets: for 2 stages, ``count`` single cuts across the model."""
    import itertools

    every = [list(c) for c in itertools.combinations(range(1, n_segments), stages - 1)]
    if len(every) <= count:
        return every
    step = len(every) / count
    return [every[int(i * step)] for i in range(count)]


def noise_ceiling(predicted: Sequence[float], repeats: Sequence[Sequence[float]]) -> tuple[float, float] | None:
    """(tau of repeat i's ordering against repeat j's, tau of the prediction against one repeat), each a mean.

    How well one repeat agrees with another bounds how well any prediction can agree with one repeat; a
    median over several repeats is steadier, so more repeats, not a better model, raise the tau against it.
    """
    import itertools

    r = min((len(x) for x in repeats), default=0)
    if r < 2 or len(repeats) < 2:
        return None
    cols = [[x[i] for x in repeats] for i in range(r)]
    self_tau = [kendall_tau(cols[i], cols[j]) for i, j in itertools.combinations(range(r), 2)]
    pred_tau = [kendall_tau(predicted, c) for c in cols]
    return sum(self_tau) / len(self_tau), sum(pred_tau) / len(pred_tau)


DEFAULT_CHUNKS = (1, 4, 8, 16, 32)


def leave_one_out(prof: Profile, plans: Sequence[tuple[tuple[int, ...], int]],
                  rows: Sequence[TrialRows | None]) -> list[float | None]:
    """Each plan's speedup predicted by a machine calibrated on every *other* plan's timeline (an honest
    figure: a plan never calibrates its own prediction); None where there are too few others."""
    out: list[float | None] = []
    for i, (cuts, m) in enumerate(plans):
        others = [r for j, r in enumerate(rows) if j != i and r is not None]
        if prof.machine is None:
            out.append(None)
            continue
        try:
            machine = fit(others).apply(prof.machine)
        except ValueError:
            out.append(None)
            continue
        out.append(simulate(prof, cuts, m, machine=machine).speedup)
    return out


def _train_prediction(prof: Profile, cuts: Sequence[int], chunks: int, actions: Any, optimizer: str) -> Any:
    """(a training step's prediction in ``simulate``'s shape, the training model's own with memory per rank)."""
    from costmodel.train import predict_train, train_stage_times
    from costmodel.types import Prediction

    if not actions:
        raise ValueError("no action order was recorded for this plan (the torch backend records it)")
    tp = predict_train(prof, cuts, chunks, actions, optimizer=optimizer)
    times, _ = train_stage_times(prof, cuts, chunks)
    ceiling = prof.machine.ceiling(len(actions)) if prof.machine is not None else None
    makespan = max(tp.makespan_s, tp.serial_s / ceiling) if ceiling else tp.makespan_s
    pred = Prediction(cuts=tuple(cuts), chunks=chunks, stage_s=tuple(t.forward + t.backward for t in times),
                      transfer_s=tuple(t.link_forward for t in times[:-1]), makespan_s=makespan, serial_s=tp.serial_s,
                      bubble_fraction=tp.bubble_fraction, ceiling=ceiling)
    return pred, tp


def memory_lines(records: Sequence[dict[str, Any]]) -> list[str]:
    """Predicted vs measured memory per rank of each training plan: what a step adds (peak less the memory
    held as it starts), and the whole peak, predicted as parameters + optimizer state + the step plus the
    runtime's own (the least the *other* plans held beyond their prediction on that rank: no plan calibrates
    itself, and rank 0 also holds the serial model it times)."""
    plans = [r for r in records if r.get("predicted_step_bytes") and r.get("base_mem_bytes")]
    if not plans:
        return []
    adds = [(p, pk - b) for r in plans
            for p, pk, b in zip(r["predicted_step_bytes"], r["peak_mem_bytes"], r["base_mem_bytes"])]
    errors = [abs(p - m) / m for p, m in adds if m > 0]
    lines = ["memory a step adds per rank (gradients, activations in flight, temporaries), predicted/measured MiB: "
             + "; ".join(f"{p / 2**20:.0f}/{m / 2**20:.0f}" for p, m in adds)
             + (f"; MAPE {100 * statistics.mean(errors):.1f}%, worst {100 * max(errors):.1f}%" if errors else "")]
    whole = []
    for i, r in enumerate(plans):
        others = [(o["peak_mem_bytes"], o["predicted_mem_bytes"]) for j, o in enumerate(plans) if j != i]
        runtime = rank_runtime_bytes(others) if others else ()
        whole += [(q + rt, pk) for q, pk, rt in zip(r["predicted_mem_bytes"], r["peak_mem_bytes"], runtime)]
    if whole:
        err = [abs(a - b) / b for a, b in whole]
        lines.append("peak memory per rank, predicted (parameters, optimizer state, the step, + the runtime the other "
                     "plans held beyond their prediction on that rank) vs measured MiB: "
                     + "; ".join(f"{a / 2**20:.0f}/{b / 2**20:.0f}" for a, b in whole)
                     + f"; MAPE {100 * statistics.mean(err):.1f}%, worst {100 * max(err):.1f}%")
    return lines


def parser() -> argparse.ArgumentParser:
    """The command's flags, apart from running it, so the docs' reference is generated from them."""
    from costmodel.profile import add_cache_args, add_device_memory_arg
    from pipeline.cli import Parser, add_model_args, positive_int
    from pipeline.core.plan import MODES, OPTIMIZERS, SCHEDULES

    p = Parser(prog="python -m costmodel.validate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="examples:\n  python -m costmodel.validate --stages 2 --chunks 1,4,8,16,32\n"
                                "  python -m costmodel.validate --stages 2 --mode train --schedule 1F1B --chunks 2,4,8")
    add_model_args(p)
    p.add_argument("--stages", type=int, default=2,
                   help="the pipeline's ranks (default 2), as in every command; with --stages-per-rank V each plan "
                   "is cut into stages x V pieces")
    p.add_argument("--chunks", default=None, help="comma-separated chunk counts, each dividing the batch (default: "
                   f"those of {','.join(map(str, DEFAULT_CHUNKS))} that divide it)")
    p.add_argument("--cuts", type=int, default=5, help="how many cut placements to try (default 5)")
    p.add_argument("--threads-per-stage", type=positive_int, default=1)
    p.add_argument("--backend", default="torch", choices=("torch", "pippy"))
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--schedule", default="GPipe", choices=SCHEDULES,
                   help="the schedule of every plan (default GPipe); with --mode train every schedule is priced "
                   "by replaying the action order torch ran for it, forward-only GPipe and 1F1B by the flow shop")
    p.add_argument("--stages-per-rank", type=positive_int, default=1, metavar="V",
                   help="stages per rank for the multi-stage schedules (--stages counts ranks)")
    p.add_argument("--mode", default="infer", choices=MODES,
                   help="'train' times whole training steps and prices them from a training profile (each segment's "
                   "backward and optimizer step) in each schedule's recorded action order, with memory per stage")
    p.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS)
    p.add_argument("--repeats", type=int, default=2, help="timed pipeline repeats per plan in each round (default 2)")
    p.add_argument("--rounds", type=int, default=2,
                   help="rounds over the whole grid, interleaving the plans (default 2); each plan's figure is the "
                   "median of rounds x repeats")
    add_cache_args(p)
    p.add_argument("--out", default=None, help="also write every plan's predicted and measured numbers as JSON here")
    add_device_memory_arg(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from pipeline.logs import quiet_logs

    quiet_logs()
    from tqdm import tqdm

    from costmodel.profile import check_whole_fits, load_for_stages
    from pipeline.cli import spec_from_args
    from pipeline.core.plan import (
        SplitPlan,
        SplitPoint,
        check_ranks,
        choose_chunks,
        parse_chunks,
        schedule_chunks,
    )
    from pipeline.ranks.hosts import available_cores
    from pipeline.ranks.launch import open_pool
    from pipeline.rounds import interleaved

    args = parser().parse_args(argv)
    try:
        check_ranks(args.stages, args.stages_per_rank)
        spec = spec_from_args(args)
        check_whole_fits(spec, args.device_memory, args.granularity, device=args.device, mode=args.mode)
        per = args.stages_per_rank
        train = args.mode == "train"
        if not train and (args.schedule not in ("GPipe", "1F1B") or per != 1):
            raise PipesplitError(f"forward-only plans on {args.schedule} with V = {per} are not priced: use GPipe or "
                                 "1F1B, or --mode train (which replays every schedule's own action order)")
        chunks = schedule_chunks(choose_chunks(None if args.chunks is None else parse_chunks(args.chunks),
                                               spec.batch_size, DEFAULT_CHUNKS), args.schedule, args.stages * per,
                                 per, mode=args.mode)
        if args.repeats < 1 or args.rounds < 1:
            raise PipesplitError(f"--repeats {args.repeats} and --rounds {args.rounds} must be at least 1")
        # one pool profiles (segments timed alone, then in every worker at once) and runs the grid
        with open_pool(args.stages, device=args.device, threads_per_stage=args.threads_per_stage) as pool:
            prof, _ = load_for_stages(spec, stages=args.stages, device=args.device, threads=args.threads_per_stage,
                                      granularity=args.granularity, reprofile=args.reprofile, root=Path(args.cache_dir),
                                      train=train, pool=pool)
            grid = [(cuts, m) for cuts in _grid_cuts(len(prof.segments), args.stages * per, args.cuts) for m in chunks]
            plans = [SplitPlan(model=spec, split_points=tuple(SplitPoint(prof.segments[c].fqn) for c in cuts),
                               chunks=m, backend=args.backend, device=args.device,
                               threads_per_stage=args.threads_per_stage, schedule=args.schedule, stages_per_rank=per,
                               mode=args.mode, optimizer=args.optimizer)
                     for cuts, m in grid]
            # rounds interleave the plans, so a machine that drifts over the minutes a grid takes slows all alike
            with tqdm(total=len(grid) * args.rounds, desc="real trials", unit="trial") as bar:
                runs = interleaved(pool, plans, args.rounds, repeats=args.repeats, drop_failed=True,
                                   tick=lambda i, r: bar.update())
        for i, why in runs.failures.items():
            print(f"failed: {plans[i].describe()}: {why}", file=sys.stderr)
        # the action order depends on the schedule, ranks, V and chunks, not on the cuts: the first run of each
        # chunk count prices them all (its own run included, as torch's schedule objects would)
        orders: dict[int, Any] = {}
        for i, (_, m) in enumerate(grid):
            if i not in runs.failures and runs.results[i] and m not in orders:
                orders[m] = runs.results[i][-1].extra.get("actions")
        rows = []
        calib_rows: list[TrialRows | None] = []
        records: list[dict[str, Any]] = []
        for i, ((cuts, m), plan) in enumerate(zip(grid, plans)):
            res = runs.results[i]
            if i in runs.failures or not res:
                continue
            actions = res[-1].extra.get("actions")
            pred, tp = (simulate(prof, cuts, m), None) if not train else \
                _train_prediction(prof, cuts, m, orders.get(m) or actions, args.optimizer)
            measured = [t for r in res for t in r.pipeline_s]
            meas = statistics.median(measured)
            rows.append((plan, pred, meas, min(measured), max(measured), statistics.median(runs.speedups(i))))
            spans = [[(a, b) for _, a, b in ev] for ev in res[-1].events]
            # a training step's timeline holds backward work the forward model does not price: no calibration
            calib_rows.append(trial_rows(pred.stage_s, spans, prof.machine)
                              if prof.machine and args.mode == "infer" else None)
            peaks = [max(r.peak_mem_bytes[k] for r in res) for k in range(len(res[0].peak_mem_bytes))]
            records.append({"cuts": cuts, "chunks": m, "plan": plan.to_dict(), "predicted": pred.to_dict(),
                            "pipeline_s": measured,
                            "peak_mem_bytes": peaks, "schedule": args.schedule, "mode": args.mode,
                            "base_mem_bytes": [min(r.base_mem_bytes[k] for r in res) for k in range(len(peaks))]
                            if res[0].base_mem_bytes else [],
                            "predicted_step_bytes": list(tp.rank_step_bytes) if tp is not None else None,
                            "predicted_mem_bytes": list(tp.rank_mem_bytes) if tp is not None else None,
                            "actions": actions,
                            "serial_s": [t for r in res for t in r.serial_s], "speedups": runs.speedups(i),
                            "stage_compute_s": [list(r.stage_compute_s) for r in res],
                            "events": [list(map(list, ev)) for ev in res[-1].events]})
    except (PipesplitError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    calibrated = leave_one_out(prof, [(r[1].cuts, r[1].chunks) for r in rows], calib_rows)
    for rec, cal in zip(records, calibrated):
        rec["calibrated_speedup"] = cal
    if args.mode == "train":
        print(f"training steps on {args.schedule} (V = {args.stages_per_rank}, {args.optimizer}): each priced from the "
              "training profile in the action order torch ran for its chunk count (costmodel.train)")
    print(f"{'cut(s)':<24} {'chunks':>6} {'predicted_s':>11} {'measured_s':>10} {'spread_s':>13} {'error':>7} "
          f"{'pred_speedup':>12} {'calibrated':>10} {'speedup':>7} {'error':>7}  peak_MiB/stage")
    for (plan, pred, meas, lo, hi, speedup), cal, rec in zip(rows, calibrated, records):
        label = ",".join(pt.fqn for pt in plan.split_points)
        print(f"{label:<24} {plan.chunks:6d} {pred.makespan_s:11.3f} {meas:10.3f} {lo:6.3f}-{hi:6.3f} "
              f"{100 * (pred.makespan_s - meas) / meas:+6.1f}% {pred.speedup:12.2f} "
              f"{'-' if cal is None else format(cal, '.2f'):>10} {speedup:7.2f} "
              f"{100 * (pred.speedup - speedup) / speedup:+6.1f}%  "
              + ",".join(f"{b / 2**20:.0f}" for b in rec["peak_mem_bytes"]))
    for line in memory_lines(records):
        print(line)
    if rows:
        ceiling = rows[0][1].ceiling
        above = sum(1 for r in rows if ceiling is not None and r[1].speedup > ceiling + 1e-9)
        print(f"ceiling: {args.stages} stages x {args.threads_per_stage} thread(s) on {available_cores()} core(s) "
              f"give at most {ceiling if ceiling is not None else float('nan'):.2f}x; predictions above it: "
              f"{above} of {len(rows)}; measured above it: "
              f"{sum(1 for r in rows if ceiling is not None and r[5] > ceiling)} of {len(rows)}")
    if len(rows) >= 2:
        series = [("pipeline seconds", [r[1].makespan_s for r in rows], [r[2] for r in rows], "pipeline_s"),
                  ("speedup", [r[1].speedup for r in rows], [r[5] for r in rows], "speedups")]
        usable = [i for i, c in enumerate(calibrated) if c is not None]
        if len(usable) >= 2:
            series.append(("calibrated speedup (leave-one-out)", [float(calibrated[i] or 0.0) for i in usable],
                           [rows[i][5] for i in usable], "speedups"))
        for what, pr, me, reps in series:
            print(f"{what}: MAPE {mape(pr, me):.1f}%  Kendall tau {kendall_tau(pr, me):.3f}  over {len(pr)} plans")
            # the calibrated figures are held against the same repeats: the speedup's noise line applies
            noise = None if what.startswith("calibrated") else noise_ceiling(pr, [r[reps] for r in records])
            if noise is not None:
                print(f"  noise: one repeat against another ranks the plans with tau {noise[0]:.3f} (mean over "
                      f"pairs of repeats); the prediction against one repeat, {noise[1]:.3f}")
    if args.out:
        from pipeline.core.atomic import write_json

        write_json(args.out, {"profile_key": prof.key, "plans": records})
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
