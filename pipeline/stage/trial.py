"""One trial on one rank: build, agree, check the output, warm up, then timed repeats, interleaved.

    build the stage (cut from the worker's cached export, or trace a private copy of the cached model) -> every
    rank built? -> run the batch once and check the last stage's output against the unsplit model -> warm up
    -> ``repeats`` times: serial on rank 0 | pipeline on all ranks | serial on all threads on rank 0

With ``check_first_repeat`` the output of the first timed repeat is the one checked, and no run of its
own precedes the timing (what a search trial of a model whose run takes seconds does).

A trial may keep its checked stage (``keep``) so that the next trial of the same plan (``resume``) adds
repeats without building or checking again: the search races plans a few repeats at a time this way.

The other ranks wait in a barrier while rank 0 times the serial model, so it has the machine to itself.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

import torch
import torch.distributed as dist

from pipeline.core.errors import PipesplitError, one_line
from pipeline.core.plan import SplitPlan
from pipeline.core.result import OutputCheck
from pipeline.models.batch import Batch
from pipeline.models.meta import MetaModel
from pipeline.models.weights import whole_model
from pipeline.stage.build import BuiltStage, build_stage, other_backend
from pipeline.stage.checks import check_output, check_step, first_out, loss_target, mismatch, reference_first, whole_key
from pipeline.stage.instrument import CommClock, CommSpan, ComputeClock, Span, hook_pippy_p2p, quiet_stderr, since
from pipeline.stage.mesh import MeshView, mesh_view, replica_rows
from pipeline.stage.messages import ErrorReply, TrialOptions, TrialReply
from pipeline.stage.rank import RankState
from pipeline.stage.reference import release
from pipeline.stage.relay import plan_relay, relay_output
from pipeline.stage.training import SerialTrainer

__all__ = ["run_trial"]


def _gather(state: RankState, flag: bool) -> list[bool]:
    """Every rank's ``flag``: a kept stage is reused only when every rank kept it."""
    flags: list[Any] = [None] * state.world
    dist.all_gather_object(flags, flag)
    return [bool(f) for f in flags]


def run_trial(state: RankState, plan: SplitPlan, opts: TrialOptions) -> TrialReply | ErrorReply:
    """This rank's part of one trial of ``plan`` (every rank of the group runs it at once)."""
    t_recv = time.perf_counter()
    rank = state.rank
    if state.device.type == "cpu":
        torch.set_num_threads(plan.threads_per_stage)
    state.peak.reset()
    state.ref_dir, state.output_made, state.output_how = opts.reference_dir, False, None
    identity = json.dumps(plan.to_dict(), sort_keys=True)
    kept = state.kept if opts.resume and state.kept is not None and state.kept[0] == identity else None
    if state.kept is not None and kept is None:
        _let_go(state.kept[1])  # a stage kept for another plan is released before this one is built
    state.kept = None
    if opts.resume and not all(_gather(state, kept is not None)):
        kept = None  # some rank kept nothing (a restarted pool): every rank builds and checks afresh
    error = None
    stage: BuiltStage | None = None
    train = plan.mode == "train"
    whole_on_rank0 = (opts.serial or opts.serial_all) and not train  # every rank knows rank 0 holds the whole model
    target = None
    mesh: MeshView | None = None
    pp_rank = rank
    got: tuple[MetaModel, Batch] | None = None
    try:
        if plan.dp_shard > 1:  # every rank makes the mesh's groups at once (a collective), once per shape
            mesh = mesh_view(rank, plan.ranks, plan.dp_shard, state.device, plan.mesh_order)
            pp_rank = mesh.pp_rank
        meta = state.model(plan.model)
        x = state.batch(plan.model)
        got = (meta, x)
        xs = replica_rows(x, mesh.dp_rank, mesh.dp_shard) if mesh is not None else x
        if train:
            target = loss_target(plan, meta, x)
    except Exception as e:  # noqa: BLE001 - reported as the trial's reason
        error = f"rank {rank} could not build its stage for cuts [{', '.join(plan.split_spec())}]: {one_line(e)}"
    relay = None
    if not train and plan.backend == "torch" and not whole_on_rank0:  # every rank asks at once (a collective)
        relay = plan_relay(state, plan, got if error is None else None)
    try:
        if error is not None:
            raise _Failed(error)
        if relay is None and rank == plan.last_rank and plan.backend == "torch" and plan.model.key not in state.refs \
                and not train and not whole_on_rank0:  # rank 0's whole model gives the output: nothing streams
            reference_first(state, plan, meta, x)
        reuse = not train and plan.backend == "torch"
        if not reuse and kept is None:
            # a training step changes its parameters in place (nothing of them is kept), and torchpippy builds
            # the whole model its own way: what the last stage left goes before this one is built
            state.weights.clear()
        mine = replica_rows(target, mesh.dp_rank, mesh.dp_shard) if mesh is not None and target is not None else target
        stage = kept[1] if kept is not None else build_stage(plan, meta, xs, rank, state.device,
                                                             traces=state.traces if opts.cached_trace else None,
                                                             target=mine, kept=state.weights if reuse else None,
                                                             mesh=mesh)
    except _Failed:
        pass
    except Exception as e:  # noqa: BLE001 - reported as the trial's reason
        cuts = ", ".join(plan.split_spec())
        error = (f"rank {rank} could not build its stage for cuts [{cuts}]: {one_line(e)}"
                 + (f"; try --backend {other_backend(plan.backend)}" if not isinstance(e, PipesplitError) else ""))
    errors: list[Any] = [None] * state.world
    dist.all_gather_object(errors, error)
    if any(errors) or stage is None:
        return ErrorReply(rank=rank, error=next((e for e in errors if e), "no stage was built"))
    t_built = time.perf_counter()
    build_s = t_built - t_recv
    t_checked = t_warm = t_timed = t_built
    if relay is not None:  # the output reference, made by the ranks together from their own stages' tensors
        try:
            made = relay_output(state, plan, got[0], got[1], relay) if got is not None else None
        except Exception as e:  # noqa: BLE001 - a rank that fails here fails the trial with its reason
            _let_go(stage)  # (a rank still waiting on its hand-over ends with the trial's timeout)
            return ErrorReply(rank=rank, error=f"rank {rank} could not relay the reference output: {one_line(e)}")
        if made is not None:
            state.output_ref(plan.model, lambda: made, "relayed")
    clock = ComputeClock(stage.modules, state.device)
    if stage.work is not None:
        stage.work.now = clock.now  # the schedule's actions on the compute spans' clock
    comm = CommClock(clock.now)
    if plan.backend == "pippy" and stage.runtime is not None:
        hook_pippy_p2p(stage.runtime, comm, rank, state.world)
    else:
        state.comm = comm
    last = pp_rank == plan.last_rank
    inp = xs if pp_rank == 0 else None  # what this rank's stage takes: its replica's batch on a first stage
    serial_threads = plan.threads_per_stage * state.world if state.device.type == "cpu" else None
    serial: list[float] = []
    serial_all: list[float] = []
    pipe: list[float] = []
    compute: list[float] = []
    waits: list[float] = []
    events: list[Span] = []
    comm_events: list[CommSpan] = []
    t0_abs = float("nan")
    trace = None
    checked = kept is not None  # the output check passed when a kept stage was built, in the trial that kept it
    diff, tol, out_bytes = (kept[2], kept[3], kept[4]) if kept is not None else (float("nan"), float("nan"), 0)
    check: OutputCheck | None = kept[5] if kept is not None else None
    check_in_loop = 0.0
    peak, base = 0, 2**62
    work_events: list[CommSpan] = []
    timed_serial = rank == 0 and (opts.serial or opts.serial_all)
    trainer = SerialTrainer(whole_model(meta, state.device), plan.optimizer, target,
                            plan.model.mixed_precision) \
        if train and timed_serial and target is not None else None
    serial_model = state.serial_model(plan.model) if timed_serial and not train else None

    def serial_run() -> Any:
        if trainer is not None:
            return trainer.step(x)
        if serial_model is None:
            return None
        out = serial_model(*x)
        if whole_on_rank0:  # the whole model's own output, which the check compares with: no forward of its own
            state.cached(whole_key(plan), lambda: first_out(out).detach().contiguous())
        return out

    try:
        with torch.set_grad_enabled(train):
            if not checked and (train or not opts.check_first_repeat):
                y = stage.step(inp)
                state.sync()
                out_bytes = 0 if last else clock.out_bytes
                if train:
                    assert target is not None
                    diff, tol, what, check = check_step(state, plan, stage, y, meta, x, target, mesh)
                    if stage.update is not None:
                        stage.update()
                else:
                    check = check_output(state, plan, y, stage, meta, x, serial_model, whole_on_rank0)
                    diff, tol = check.diff, check.tolerance
                    what = "pipeline output differs from the unsplit model"
                checked = True
                y = None  # the checked output is not kept through the timed runs (a language model's logits)
                if not diff <= tol:
                    return mismatch(rank, diff, tol, what)
            t_checked = time.perf_counter()
            for _ in range(opts.warmup):
                _pipeline_once(state, stage, inp, clock)
            # the serial model stays warm in this worker: warm it up once per model and thread count (a serial
            # trainer is the trial's own, its optimizer state made on its first step: warm it every trial)
            if opts.serial and (train or (plan.model.key, plan.threads_per_stage) not in state.warm):
                state.serial(serial_run, None)
                if not train:
                    state.warm.add((plan.model.key, plan.threads_per_stage))
            if opts.serial_all and serial_threads and (train or (plan.model.key, serial_threads) not in state.warm):
                state.serial(serial_run, serial_threads)
                if not train:
                    state.warm.add((plan.model.key, serial_threads))
            t_warm = time.perf_counter()
            for _ in range(opts.repeats):
                if opts.serial:
                    serial.append(state.serial(serial_run, None))
                y = None  # the last run's output goes before this one makes its own
                state.peak.reset()  # the pipeline's own peak: not the build's, nor the serial model's
                wall, busy, events, comm_events, t0_abs, y, work = _pipeline_once(state, stage, inp, clock, comm)
                peak, base = max(peak, state.peak.read()), min(base, state.peak.base)
                work_events = work
                pipe.append(wall)
                c = sum(b - a for _, a, b in events)
                compute.append(c)
                waits.append(max(0.0, busy - c))
                if not checked:  # the first timed repeat's output is the one checked
                    t_c = time.perf_counter()
                    out_bytes = 0 if last else clock.out_bytes
                    check = check_output(state, plan, y, stage, meta, x, serial_model, whole_on_rank0)
                    diff, tol = check.diff, check.tolerance
                    checked = True
                    check_in_loop += time.perf_counter() - t_c
                    if not diff <= tol:
                        return mismatch(rank, diff, tol, "pipeline output differs from the unsplit model")
                if opts.serial_all and serial_threads:
                    serial_all.append(state.serial(serial_run, serial_threads))
            t_timed = time.perf_counter()
            if opts.trace_dir:
                trace = _trace(state, stage, inp, clock, comm, opts.trace_dir)
            if opts.keep:
                state.kept = (identity, stage, diff, tol, out_bytes, check)
    finally:
        clock.close()
        state.comm = None
        own, actions = stage.own_bytes, tuple(stage.actions)
        reused = 0 if kept is not None else stage.reused_bytes  # a resumed trial built nothing
        if state.kept is None or state.kept[1] is not stage:
            _let_go(stage)
    return TrialReply(rank=rank, build_s=build_s, out_bytes=out_bytes, max_abs_diff=diff, tolerance=tol, check=check,
                      serial_s=tuple(serial), serial_all_s=tuple(serial_all), pipeline_s=tuple(pipe),
                      compute_s=tuple(compute), comm_s=tuple(waits), events=tuple(events),
                      comm_events=tuple(comm_events), t0=t0_abs, host=socket.gethostname(),
                      peak_mem_bytes=peak if pipe else state.peak.read(), base_mem_bytes=base if pipe else 0,
                      stage_bytes=own, reused_bytes=reused,
                      busy_s=time.perf_counter() - t_recv, trace=trace,
                      phases=(build_s, t_checked - t_built + check_in_loop, t_warm - t_checked,
                              t_timed - t_warm - check_in_loop), actions=actions,
                      work_events=tuple(work_events))


class _Failed(Exception):
    """The trial failed before its build: the reason is already this rank's ``error``."""


def _let_go(stage: BuiltStage) -> None:
    """Free a stage this rank runs no more now, not at the cyclic collector's pace: its weights, gradients and
    optimizer state would otherwise sit under the next trial's measured peak."""
    stage.params.clear()
    stage.update = None  # the optimizer's state goes with it
    for m in stage.modules:
        release(m)  # a big stage is collected and its heap handed back at once; a small one at the collector's pace


def _trace(state: RankState, stage: BuiltStage, x: Batch | None, clock: ComputeClock, comm: CommClock,
           folder: str) -> str:
    """One more pipeline run under torch.profiler; its chrome trace (Perfetto opens it) per rank."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if state.device.type == "cuda" else [])
    with quiet_stderr(), profile(activities=acts) as prof:
        _pipeline_once(state, stage, x, clock, comm)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"rank{state.rank}.json")
    prof.export_chrome_trace(path)
    return path


def _pipeline_once(state: RankState, stage: BuiltStage, x: Batch | None, clock: ComputeClock,
                   comm: CommClock | None = None) -> tuple[float, float, list[Span], list[CommSpan], float, Any,
                                                           list[CommSpan]]:
    """One whole batch through the pipeline (``x``: the stage's input on a first stage, else None): (wall time
    to the last rank's end, own busy time, compute spans, send/recv spans, the run's start on this host's
    monotonic clock, the output on the last rank, the schedule's actions as (name, start, end) on the same base)."""
    clock.reset()
    if comm is not None:
        comm.reset()
    state.sync()
    dist.barrier()
    t0_event = None
    if state.device.type == "cuda":
        t0_event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        t0_event.record()
    t0 = time.perf_counter()
    y = stage.step(x)
    if stage.update is not None:
        stage.update()
    state.sync()
    busy = time.perf_counter() - t0
    dist.barrier()
    wall = time.perf_counter() - t0
    base: Any = t0_event if t0_event is not None else t0
    comm_spans = comm.resolve(base, t0_event is not None) if comm is not None else []
    work = [(name, *since(base, a, b, t0_event is not None)) for name, a, b in stage.work.spans] \
        if stage.work is not None else []
    return wall, busy, clock.resolve(base), comm_spans, t0, y, work
