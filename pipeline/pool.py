"""StagePool: S stage-worker processes started once and reused for many trials, restarted on faults.

The driver (this process) is not a rank: it sends each plan to every worker over a pipe and collects
their measurements, so it can kill and restart a pool whose worker died or hung without losing itself.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import sys
import time
from multiprocessing.connection import Connection, wait
from typing import Any

from pipeline.errors import PipesplitError
from pipeline.plan import SplitPlan
from pipeline.result import TrialResult, median
from pipeline.worker import WorkerConfig, worker_main


FATAL_GRACE_S = 10.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def default_threads(stages: int) -> int:
    """Threads per stage that fill the machine's cores without oversubscribing them (at least one); under
    torchrun only this host's ranks share its cores."""
    from pipeline.launch import torchrun_env

    env = torchrun_env()
    local = env.local_world_size if env is not None else stages
    return max(1, available_cores() // local)


def resolve_device(device: str, stages: int) -> str:
    """The device a command will use: ``cuda`` with fewer GPUs than stages falls back to ``cpu``, saying so
    in one line (results, study names and plans then say cpu, so nothing is mislabelled)."""
    try:
        check_device(device, stages)
    except PipesplitError as e:
        print(f"warning: {e}; falling back to --device cpu (gloo)", file=sys.stderr)
        return "cpu"
    return device


def check_device(device: str, stages: int) -> None:
    """Fail clearly when CUDA is asked for but fewer GPUs than stages exist."""
    if device != "cuda":
        return
    from pipeline.launch import torchrun_env

    if torchrun_env() is not None:
        return  # each host checks its own GPUs against its own ranks when the ranks start
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < stages:
        raise PipesplitError(
            f"--device cuda needs one GPU per stage: found {n} GPU(s) for {stages} stages; "
            "use --device cpu or fewer --stages"
        )


def _aligned(ranks: list[dict[str, Any]], key: str, at: int) -> list[list[tuple]]:
    """Each rank's events shifted onto one clock: ranks on one host share its monotonic clock, so the
    offset between their starts is known exactly; across hosts each rank keeps its own (barrier-aligned) start."""
    hosts = {d.get("host") for d in ranks}
    t0s = [d.get("t0", float("nan")) for d in ranks]
    base = min(t0s) if len(hosts) == 1 and all(t == t for t in t0s) else None
    out = []
    for d, t0 in zip(ranks, t0s):
        shift = t0 - base if base is not None else 0.0
        out.append([tuple(v + shift if i in (at, at + 1) else v for i, v in enumerate(e)) for e in d.get(key, [])])
    return out


def result_from_replies(plan_dict: dict[str, Any], replies: list[Any], wall: float) -> tuple[TrialResult, bool]:
    """One TrialResult from every rank's ``("result", dict)`` reply (or ``("dead"|"timeout", why)``), and
    whether the process group may be broken (a rank died, hung or failed mid-trial)."""
    failures = [r for r in replies if not (isinstance(r, tuple) and r[0] == "result")]
    if failures:
        # a rank that failed explains the ranks left waiting on it
        errors = [r[1]["error"] for r in replies if isinstance(r, tuple) and r[0] == "result"
                  and isinstance(r[1], dict) and r[1].get("error")]
        reason = "; ".join([*[f[1] for f in failures if f[0] == "dead"], *errors,
                            *[f[1] for f in failures if f[0] != "dead"]][:2])
        return TrialResult.failed(plan_dict, reason, wall_s=wall), True
    ranks = [r[1] for r in replies]
    errors = [d for d in ranks if d.get("error")]
    if errors:
        return TrialResult.failed(plan_dict, errors[0]["error"], wall_s=wall,
                                  max_abs_diff=ranks[-1].get("max_abs_diff", float("nan")),
                                  tolerance=ranks[-1].get("tolerance", float("nan"))), \
            any(d.get("fatal") for d in errors)
    return TrialResult(
        plan=plan_dict,
        ok=True,
        serial_s=tuple(ranks[0]["serial_s"]),
        serial_all_s=tuple(ranks[0]["serial_all_s"]),
        pipeline_s=tuple(ranks[0]["pipeline_s"]),
        stage_compute_s=tuple(median(d["compute_s"]) for d in ranks),
        stage_comm_s=tuple(median(d["comm_s"]) for d in ranks),
        boundary_bytes=tuple(int(d["out_bytes"]) for d in ranks[:-1]),
        peak_mem_bytes=tuple(int(d["peak_mem"]) for d in ranks),
        max_abs_diff=float(ranks[-1]["max_abs_diff"]),
        tolerance=float(ranks[-1]["tolerance"]),
        build_s=max(d["build_s"] for d in ranks),
        wall_s=wall,
        busy_s=max(d["busy_s"] for d in ranks),
        events=tuple(tuple(tuple(e) for e in ev) for ev in _aligned(ranks, "events", 1)),
        comm_events=tuple(tuple(tuple(e) for e in ev) for ev in _aligned(ranks, "comm_events", 1)),
        traces=tuple(d["trace"] for d in ranks if d.get("trace")),
    ), False


def check_trial_args(plan: SplitPlan, stages: int, device: str, repeats: int, warmup: int) -> None:
    if plan.stages != stages:
        raise PipesplitError(f"plan has {plan.stages} stages but the pool has {stages}: start a pool per stage count")
    if plan.device != device:
        raise PipesplitError(f"plan is for {plan.device} but the pool runs on {device}")
    if repeats < 1 or warmup < 0:
        raise PipesplitError(f"repeats must be >= 1 and warmup >= 0 (got {repeats}, {warmup})")


def trial_opts(repeats: int, warmup: int, serial_all: bool, serial: bool, trace_dir: str | None) -> dict[str, Any]:
    return {"repeats": repeats, "warmup": warmup, "serial_all": serial_all, "serial": serial,
            "trace_dir": os.path.abspath(trace_dir) if trace_dir else None}


class StagePool:
    """A persistent pool of ``stages`` worker processes forming one gloo (CPU) or NCCL (CUDA) group."""

    def __init__(self, stages: int, *, device: str = "cpu", threads_per_stage: int | None = None,
                 start_timeout_s: float = 300.0, group_timeout_s: float = 600.0, quiet: bool = False) -> None:
        if stages < 2:
            raise PipesplitError(f"a pipeline needs at least 2 stages (got {stages})")
        check_device(device, stages)
        self.stages = stages
        self.device = device
        self.threads_per_stage = threads_per_stage or default_threads(stages)
        self.start_timeout_s = start_timeout_s
        self.group_timeout_s = group_timeout_s
        self.quiet = quiet
        self.restarts = 0
        self.start_s = float("nan")
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        if device == "cpu" and stages * self.threads_per_stage > available_cores() and not quiet:
            print(f"warning: {stages} stages x {self.threads_per_stage} thread(s) oversubscribe the "
                  f"{available_cores()} available core(s); timings will include contention", file=sys.stderr)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def __enter__(self) -> StagePool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Spawn the workers and wait until each has joined the process group."""
        t = time.perf_counter()
        ctx = mp.get_context("spawn")
        cfg = WorkerConfig(world_size=self.stages, device=self.device,
                           init_method=f"tcp://127.0.0.1:{_free_port()}", timeout_s=self.group_timeout_s,
                           threads=self.threads_per_stage)
        for rank in range(self.stages):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=worker_main, args=(rank, cfg, child), daemon=True, name=f"pipesplit-stage{rank}")
            p.start()
            child.close()
            self._procs.append(p)
            self._conns.append(parent)
        replies = self._collect(self.start_timeout_s)
        bad = [r for r in replies if not (isinstance(r, tuple) and r[0] == "ready")]
        if bad:
            self._kill()
            why = bad[0][1] if isinstance(bad[0], tuple) else str(bad[0])
            raise PipesplitError(f"the stage workers did not start: {why}")
        self.start_s = time.perf_counter() - t

    def _collect(self, timeout_s: float) -> list[Any]:
        """One message from every worker, or a ``("dead"|"timeout", reason)`` in place of the missing ones."""
        out: list[Any] = [None] * len(self._conns)
        pending = set(range(len(self._conns)))
        deadline = time.monotonic() + timeout_s
        failed: int | None = None
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                for r in pending:
                    why = (f"rank {r} did not answer within {FATAL_GRACE_S:.0f}s of rank {failed}'s failure"
                           if failed is not None else f"rank {r} did not answer within {timeout_s:.0f}s (hung or deadlocked)")
                    out[r] = ("timeout", why)
                break
            waitables: list[Any] = [self._conns[r] for r in pending] + [self._procs[r].sentinel for r in pending]
            wait(waitables, timeout=left)
            for r in list(pending):
                try:
                    if self._conns[r].poll():
                        out[r] = self._conns[r].recv()
                        pending.discard(r)
                        if isinstance(out[r], tuple) and isinstance(out[r][1], dict) and out[r][1].get("fatal"):
                            # its peers may now wait forever on it: give them a moment, not the whole timeout
                            deadline = min(deadline, time.monotonic() + FATAL_GRACE_S)
                            failed = r if failed is None else failed
                        continue
                except (EOFError, OSError):
                    pass  # the pipe closed: the worker is gone
                if not self._procs[r].is_alive():
                    self._procs[r].join(timeout=1)
                    code = self._procs[r].exitcode
                    how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
                    out[r] = ("dead", f"stage worker rank {r} (pid {self._procs[r].pid}) died ({how})")
                    pending.discard(r)
        return out

    def run(self, plan: SplitPlan, *, repeats: int = 3, warmup: int = 1, timeout_s: float = 900.0,
            serial_all: bool = True, serial: bool = True, trace_dir: str | None = None) -> TrialResult:
        """Run one real trial of ``plan``; a failure (bad build, wrong output, dead or hung rank) is a failed result."""
        check_trial_args(plan, self.stages, self.device, repeats, warmup)
        if not self._procs:
            self.start()
        opts = trial_opts(repeats, warmup, serial_all, serial, trace_dir)
        t = time.perf_counter()
        plan_dict = plan.to_dict()
        for conn in self._conns:
            try:
                conn.send(("trial", plan_dict, opts))
            except (BrokenPipeError, OSError):
                pass  # the sentinel reports it
        replies = self._collect(timeout_s)
        result, broken = result_from_replies(plan_dict, replies, time.perf_counter() - t)
        if broken:
            self.restart()
        return result

    def _command(self, msg: tuple[Any, ...], timeout_s: float, what: str) -> list[dict[str, Any]]:
        """Send one non-trial command to every rank; one reply dict per rank, or restart and raise."""
        if not self._procs:
            self.start()
        for conn in self._conns:
            conn.send(msg)
        replies = self._collect(timeout_s)
        bad = [r for r in replies if not (isinstance(r, tuple) and r[0] == "result") or r[1].get("error")]
        if bad:
            self.restart()
            why = bad[0][1] if isinstance(bad[0][1], str) else bad[0][1]["error"]
            raise PipesplitError(f"could not {what}: {why}")
        return [r[1] for r in replies]

    def measure_link(self, sizes: list[int], repeats: int = 5, timeout_s: float = 300.0) -> list[tuple[int, float]]:
        """(bytes, median one-way seconds) between ranks 0 and 1 of this pool's real backend."""
        ranks = self._command(("link", list(sizes), repeats), timeout_s, "measure the link")
        return [(int(b), float(t)) for b, t in ranks[0]["link"]]

    def profile(self, spec: Any, granularity: str, micro: list[int], repeats: int, warmup: int,
                timeout_s: float = 3600.0) -> list[dict[str, Any]]:
        """Every rank times every segment at once (``costmodel.profile.measure_segments``); one dict per rank."""
        msg = ("profile", spec.to_dict(), granularity, list(micro), repeats, warmup)
        return self._command(msg, timeout_s, "profile in the stage workers")

    def restart(self) -> None:
        """Kill every worker and start a fresh group: the next trial runs on a clean pool."""
        self._kill()
        self.restarts += 1
        self.start()

    def _kill(self) -> None:
        for p in self._procs:
            if p.is_alive():
                p.kill()
        for p in self._procs:
            p.join(timeout=10)
        for c in self._conns:
            c.close()
        self._procs, self._conns = [], []

    def close(self) -> None:
        """Ask the workers to leave, then make sure they are gone."""
        for c in self._conns:
            try:
                c.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
        for p in self._procs:
            p.join(timeout=5)
        self._kill()
