"""One stage worker: a rank of the pipeline process group that runs plan after plan until told to stop.

Each trial on a rank goes: build the stage (trace a private copy of a cached model) -> agree that every
rank built -> run the batch once and check the last stage's output against the unsplit model -> warm up ->
``repeats`` times, interleaved: serial on rank 0 | pipeline on all ranks | serial on all threads on rank 0.
The other ranks wait in a barrier while rank 0 times the serial model, so it has the machine to itself.
"""

from __future__ import annotations

import os
import signal
import socket
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_leaves

from pipeline.models import build_model, example_input
from pipeline.plan import SplitPlan
from pipeline.spec import ModelSpec
from pipeline.stages import build_stage


@dataclass(frozen=True)
class WorkerConfig:
    """How every rank of one pool joins its process group."""

    world_size: int
    device: str
    init_method: str
    timeout_s: float
    threads: int = 1
    local_rank: int | None = None
    """This rank's GPU index on its host (torchrun's LOCAL_RANK); the rank modulo the GPU count otherwise."""


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:400]


class _Peak:
    """Peak memory of this process during a trial: VmHWM reset through clear_refs, or CUDA's counter."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass

    def read(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class _ComputeClock:
    """Forward hooks on the stage module: compute spans per microbatch and the bytes it outputs."""

    def __init__(self, module: nn.Module, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.spans: list[tuple[Any, Any]] = []
        self.out_bytes = 0
        self._start: Any = None
        self._handles = [module.register_forward_pre_hook(self._pre), module.register_forward_hook(self._post)]

    def _now(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def _pre(self, mod: nn.Module, args: Any) -> None:
        self._start = self._now()

    def _post(self, mod: nn.Module, args: Any, out: Any) -> None:
        self.spans.append((self._start, self._now()))
        self.out_bytes += sum(t.numel() * t.element_size() for t in tree_leaves(out) if isinstance(t, torch.Tensor))

    def reset(self) -> None:
        self.spans.clear()
        self.out_bytes = 0

    def resolve(self, t0: Any) -> list[tuple[int, float, float]]:
        """Spans as (microbatch, start, end) seconds from ``t0`` (a perf_counter value or CUDA event)."""
        out = []
        for i, (a, b) in enumerate(self.spans):
            if self.cuda:
                out.append((i, t0.elapsed_time(a) / 1e3, t0.elapsed_time(b) / 1e3))
            else:
                out.append((i, a - t0, b - t0))
        return out

    def close(self) -> None:
        for h in self._handles:
            h.remove()


class _CommClock:
    """Send and receive spans of the running schedule, on the compute clock's time base (for timelines)."""

    def __init__(self, now: Any) -> None:
        self.now = now
        self.spans: list[tuple[str, Any, Any]] = []
        self.pending: dict[int, Any] = {}

    def add(self, kind: str, a: Any, b: Any) -> None:
        self.spans.append((kind, a, b))

    def reset(self) -> None:
        self.spans.clear()
        self.pending.clear()

    def resolve(self, t0: Any, cuda: bool) -> list[tuple[str, float, float]]:
        if cuda:
            return [(k, t0.elapsed_time(a) / 1e3, t0.elapsed_time(b) / 1e3) for k, a, b in self.spans]
        return [(k, a - t0, b - t0) for k, a, b in self.spans]


def _hook_torch_p2p(state: _Rank) -> None:
    """Time torch's schedule-level p2p calls (``_batch_p2p`` posts, ``_wait_batch_p2p`` waits) on this rank.

    A receive span runs from posting the irecv to the end of its wait (it includes waiting for the
    previous stage); a send is its post plus, separately, the final wait for completion.
    """
    import torch.distributed.pipelining.schedules as sched

    if getattr(sched, "_pipesplit_hooked", False):
        return
    post, wait = sched._batch_p2p, sched._wait_batch_p2p

    def timed_post(ops: Any, desc: str | None = None) -> Any:
        clock = state.comm
        if clock is None:
            return post(ops, desc)
        a = clock.now()
        works = post(ops, desc)
        if desc and "recv" in desc:
            clock.pending[id(works)] = ("recv", a)
        else:
            clock.add("send", a, clock.now())
            clock.pending[id(works)] = ("send_wait", None)
        return works

    def timed_wait(works: Any) -> None:
        clock = state.comm
        tag = clock.pending.pop(id(works), None) if clock is not None else None
        if tag is None:
            return wait(works)
        a = clock.now()
        wait(works)
        b = clock.now()
        clock.add(tag[0], tag[1] if tag[0] == "recv" else a, b)
        return None

    sched._batch_p2p, sched._wait_batch_p2p = timed_post, timed_wait
    sched._pipesplit_hooked = True


def _hook_pippy_p2p(runtime: Any, clock: _CommClock, rank: int, world: int) -> None:
    """Time torchpippy's per-chunk receive (post + wait) and send (post) on this rank's stage."""
    recv, send = runtime._recv_and_fill_inputs, runtime._send_activations

    def timed_recv(chunk: int) -> Any:
        a = clock.now()
        out = recv(chunk)
        clock.add("recv", a, clock.now())
        return out

    def timed_send(outputs: Any) -> Any:
        a = clock.now()
        out = send(outputs)
        clock.add("send", a, clock.now())
        return out

    if rank > 0:
        runtime._recv_and_fill_inputs = timed_recv
    if rank < world - 1:
        runtime._send_activations = timed_send


class _Rank:
    """A worker's state that lives across trials: its rank, device and cached models."""

    def __init__(self, rank: int, cfg: WorkerConfig) -> None:
        self.rank = rank
        self.cfg = cfg
        self.world = cfg.world_size
        self.device = torch.device(f"cuda:{gpu_index(rank, cfg)}") if cfg.device == "cuda" else torch.device("cpu")
        self.models: dict[str, nn.Module] = {}
        self.refs: dict[str, torch.Tensor] = {}
        self.warm: set[tuple[str, int]] = set()
        self.peak = _Peak(self.device)
        self.comm: _CommClock | None = None
        _hook_torch_p2p(self)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def model(self, spec: ModelSpec) -> nn.Module:
        if spec.key not in self.models:
            self.models.clear()
            self.refs.clear()
            self.warm.clear()
            self.models[spec.key] = build_model(spec).to(self.device)
        return self.models[spec.key]

    def _serial(self, model: nn.Module, x: torch.Tensor, threads: int | None) -> float:
        """Time the unsplit model on rank 0 while every other rank waits in the barrier."""
        dist.barrier()
        elapsed = float("nan")
        if self.rank == 0:
            before = torch.get_num_threads()
            if threads:
                torch.set_num_threads(threads)
            self.sync()
            t = time.perf_counter()
            model(x)
            self.sync()
            elapsed = time.perf_counter() - t
            torch.set_num_threads(before)
        dist.barrier()
        return elapsed

    def trial(self, plan_dict: dict[str, Any], opts: dict[str, Any]) -> dict[str, Any]:
        t_recv = time.perf_counter()
        out: dict[str, Any] = {"rank": self.rank}
        plan = SplitPlan.from_dict(plan_dict)
        if self.device.type == "cpu":
            torch.set_num_threads(plan.threads_per_stage)
        self.peak.reset()
        error = None
        try:
            model = self.model(plan.model)
            x = example_input(plan.model, self.device)
            stage = build_stage(plan, model, x, self.rank, self.device)
        except Exception as e:  # noqa: BLE001 - reported as the trial's reason
            cuts = ", ".join(plan.split_spec())
            error = f"rank {self.rank} could not build its stage for cuts [{cuts}]: {_one_line(e)}"
        errors: list[Any] = [None] * self.world
        dist.all_gather_object(errors, error)
        if any(errors):
            out["error"] = next(e for e in errors if e)
            return out
        out["build_s"] = time.perf_counter() - t_recv
        clock = _ComputeClock(stage.module, self.device)
        comm = _CommClock(clock._now)
        if plan.backend == "pippy" and stage.runtime is not None:
            _hook_pippy_p2p(stage.runtime, comm, self.rank, self.world)
        else:
            self.comm = comm
        last = self.rank == self.world - 1
        serial_threads = plan.threads_per_stage * self.world if self.device.type == "cpu" else None
        try:
            with torch.no_grad():
                y = stage.step(x if self.rank == 0 else None)
                self.sync()
                out["out_bytes"] = 0 if last else clock.out_bytes
                verdict: list[Any] = [None]
                if last:
                    if plan.model.key not in self.refs:
                        self.refs[plan.model.key] = model(x)
                    ref = self.refs[plan.model.key]
                    got = y[0] if isinstance(y, (tuple, list)) else y
                    diff = float((got.float() - ref.float()).abs().max())
                    rtol = 1e-4 if plan.model.dtype == "float32" else 2e-2
                    tol = rtol * max(1.0, float(ref.float().abs().max()))
                    verdict = [(diff, tol)]
                dist.broadcast_object_list(verdict, src=self.world - 1)
                out["max_abs_diff"], out["tolerance"] = verdict[0]
                if not out["max_abs_diff"] <= out["tolerance"]:
                    out["error"] = (f"output check failed: pipeline output differs from the unsplit model by "
                                    f"{out['max_abs_diff']:.3g} (allowed {out['tolerance']:.3g})")
                    return out
                for _ in range(opts["warmup"]):
                    self._pipeline_once(stage, x, clock)
                # the serial model stays warm in this worker: warm it up once per model and thread count
                if opts.get("serial", True) and (plan.model.key, plan.threads_per_stage) not in self.warm:
                    self._serial(model, x, None)
                    self.warm.add((plan.model.key, plan.threads_per_stage))
                if opts["serial_all"] and serial_threads and (plan.model.key, serial_threads) not in self.warm:
                    self._serial(model, x, serial_threads)
                    self.warm.add((plan.model.key, serial_threads))
                serial, serial_all, pipe, compute, waits = [], [], [], [], []
                events: list[tuple[int, float, float]] = []
                comm_events: list[tuple[str, float, float]] = []
                t0_abs = float("nan")
                for _ in range(opts["repeats"]):
                    if opts.get("serial", True):
                        serial.append(self._serial(model, x, None))
                    wall, busy, events, comm_events, t0_abs = self._pipeline_once(stage, x, clock, comm)
                    pipe.append(wall)
                    c = sum(b - a for _, a, b in events)
                    compute.append(c)
                    waits.append(max(0.0, busy - c))
                    if opts["serial_all"] and serial_threads:
                        serial_all.append(self._serial(model, x, serial_threads))
                if opts.get("trace_dir"):
                    out["trace"] = self._trace(stage, x, clock, comm, opts["trace_dir"])
        finally:
            clock.close()
            self.comm = None
        out.update(serial_s=serial, serial_all_s=serial_all, pipeline_s=pipe, compute_s=compute, comm_s=waits,
                   events=events, comm_events=comm_events, t0=t0_abs, host=socket.gethostname(),
                   peak_mem=self.peak.read(), busy_s=time.perf_counter() - t_recv)
        return out

    def _trace(self, stage: Any, x: torch.Tensor, clock: _ComputeClock, comm: _CommClock, folder: str) -> str:
        """One more pipeline run under torch.profiler; its chrome trace (Perfetto opens it) per rank."""
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        with _quiet_stderr(), profile(activities=acts) as prof:
            self._pipeline_once(stage, x, clock, comm)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"rank{self.rank}.json")
        prof.export_chrome_trace(path)
        return path

    def profile(self, spec_dict: dict[str, Any], granularity: str, micro: list[int], repeats: int,
                warmup: int) -> dict[str, Any]:
        """Time every segment here while the other ranks do the same (see ``costmodel.profile``)."""
        from costmodel.profile import measure_segments

        if self.device.type == "cpu":
            torch.set_num_threads(self.cfg.threads)
        out = measure_segments(ModelSpec.from_dict(spec_dict), granularity=granularity, micro=micro, repeats=repeats,
                               warmup=warmup, device=self.device, count=self.rank == 0, together=dist.barrier)
        dist.barrier()
        return {"rank": self.rank, **out}

    def link(self, sizes: list[int], repeats: int) -> dict[str, Any]:
        """Ping-pong between ranks 0 and 1: median one-way seconds for each message size."""
        out = []
        for size in sizes:
            buf = torch.zeros(max(1, size // 4), dtype=torch.float32, device=self.device)
            times = []
            for i in range(repeats + 1):
                dist.barrier()
                self.sync()
                t = time.perf_counter()
                if self.rank == 0:
                    dist.send(buf, 1)
                    dist.recv(buf, 1)
                elif self.rank == 1:
                    dist.recv(buf, 0)
                    dist.send(buf, 0)
                self.sync()
                if i:
                    times.append((time.perf_counter() - t) / 2)
            out.append((buf.numel() * 4, sorted(times)[len(times) // 2]))
        return {"rank": self.rank, "link": out}

    def _pipeline_once(self, stage: Any, x: torch.Tensor, clock: _ComputeClock,
                       comm: _CommClock | None = None) -> tuple[float, float, list, list, float]:
        """One whole batch through the pipeline: (wall time to the last rank's end, own busy time, compute
        spans, send/recv spans, the run's start on this host's monotonic clock)."""
        clock.reset()
        if comm is not None:
            comm.reset()
        self.sync()
        dist.barrier()
        t0_event = None
        if self.device.type == "cuda":
            t0_event = torch.cuda.Event(enable_timing=True)
            t0_event.record()
        t0 = time.perf_counter()
        stage.step(x if self.rank == 0 else None)
        self.sync()
        busy = time.perf_counter() - t0
        dist.barrier()
        wall = time.perf_counter() - t0
        base = t0_event if t0_event is not None else t0
        comm_spans = comm.resolve(base, t0_event is not None) if comm is not None else []
        return wall, busy, clock.resolve(base), comm_spans, t0


class _quiet_stderr:
    """Silence file descriptor 2 for a moment: kineto logs every profiler start/stop there from C++."""

    def __enter__(self) -> None:
        import sys

        sys.stderr.flush()
        self.saved = os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)

    def __exit__(self, *exc: object) -> None:
        os.dup2(self.saved, 2)
        os.close(self.saved)


def _preload() -> None:
    """Import the tracing stack once per worker, so the first trial's build time is its own."""
    import pippy  # noqa: F401
    import torch._dynamo  # noqa: F401
    import torch.distributed.pipelining  # noqa: F401
    import torch.export  # noqa: F401


def gpu_index(rank: int, cfg: WorkerConfig) -> int:
    """The GPU a rank drives: torchrun's LOCAL_RANK when given, else the rank modulo this host's GPUs."""
    return cfg.local_rank if cfg.local_rank is not None else rank % max(1, torch.cuda.device_count())


def join_group(rank: int, cfg: WorkerConfig) -> _Rank:
    """Join the pipeline's process group (gloo on CPU, NCCL on CUDA) and set up this rank's state."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # torch.profiler (--profile) is chatty on stderr otherwise
    backend = "nccl" if cfg.device == "cuda" else "gloo"
    if cfg.device == "cuda":
        torch.cuda.set_device(gpu_index(rank, cfg))
    dist.init_process_group(backend, init_method=cfg.init_method, rank=rank, world_size=cfg.world_size,
                            timeout=timedelta(seconds=cfg.timeout_s))
    if cfg.device == "cpu":
        torch.set_num_threads(cfg.threads)
    state = _Rank(rank, cfg)
    _preload()
    return state


def handle(state: _Rank, msg: tuple[Any, ...]) -> dict[str, Any]:
    """Answer one driver command (trial, profile, link) on this rank; an exception becomes a fatal reply."""
    rank = state.rank
    kind = msg[0]
    try:
        if kind == "trial":
            return state.trial(msg[1], msg[2])
        if kind == "profile":
            return state.profile(*msg[1:])
        if kind == "link":
            return state.link(msg[1], msg[2])
        return {"rank": rank, "error": f"unknown command {kind!r}", "fatal": True}
    except Exception as e:  # noqa: BLE001 - the process group may be broken: the driver restarts the pool
        what = {"trial": "failed mid-trial", "profile": "could not profile", "link": "could not measure the link"}
        return {"rank": rank, "error": f"rank {rank} {what.get(kind, 'failed')}: {_one_line(e)}", "fatal": True,
                "trace": traceback.format_exc()[-2000:]}


def worker_main(rank: int, cfg: WorkerConfig, conn: Any) -> None:
    """Process entry point: join the group, then answer the driver's messages until ``stop``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver owns Ctrl-C and shuts the pool down
    try:
        state = join_group(rank, cfg)
        conn.send(("ready", rank))
    except Exception as e:  # noqa: BLE001
        conn.send(("error", f"rank {rank} could not join the process group: {_one_line(e)}"))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg[0] == "stop":
            break
        conn.send(("result", handle(state, msg)))
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass
