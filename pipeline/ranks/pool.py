"""StagePool: S stage-worker processes started once and reused for many trials, restarted on faults.

The driver (this process) is not a rank: it sends each command to every worker over a pipe and collects
their replies, so it can kill and restart a pool whose worker died or hung without losing itself.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import sys
import time
from multiprocessing.connection import Connection, wait
from typing import Any

from pipeline.core.errors import PipesplitError
from pipeline.core.plan import SplitPlan
from pipeline.core.result import TrialResult
from pipeline.core.spec import ModelSpec
from pipeline.ranks.hosts import available_cores, check_device, default_threads
from pipeline.ranks.pooling import RunsTrials, link_samples, result_from_replies
from pipeline.ranks.protocol import MeasureLink, ProfileSegments, RunTrial, Stop
from pipeline.ranks.worker import worker_main
from pipeline.stage.messages import ErrorReply, Lost, Ready, Reply, SegmentReply, TrialOptions
from pipeline.stage.rank import TRACING_STACK, WorkerConfig

__all__ = ["StagePool"]

FATAL_GRACE_S = 10.0


PRELOAD = ("pipeline.ranks.worker", "timm", *TRACING_STACK)
"""What a stage worker imports before it can answer (torch, the stage code, timm), imported once into the
``forkserver`` that every worker of this process is forked from, not again by each worker."""


def start_context() -> Any:
    """The context workers start from: a ``forkserver`` that has already imported ``PRELOAD`` (and transformers
    where this process uses it), so a worker starts warm; ``spawn`` where there is no forkserver (not POSIX)."""
    if "forkserver" not in mp.get_all_start_methods() or os.environ.get("PIPESPLIT_START") == "spawn":
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([*PRELOAD, *(["transformers"] if "transformers" in sys.modules else [])])
    return ctx


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StagePool(RunsTrials):
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
            print(f"warning: {stages} rank processes x {self.threads_per_stage} thread(s) oversubscribe the "
                  f"{available_cores()} available core(s); timings will include contention", file=sys.stderr)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def __enter__(self) -> StagePool:
        self.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Spawn the workers and wait until each has joined the process group."""
        t = time.perf_counter()
        ctx = start_context()
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
        bad = [r for r in replies if not isinstance(r, Ready)]
        if bad:
            self._kill()
            why = bad[0].why if isinstance(bad[0], Lost) else getattr(bad[0], "error", repr(bad[0]))
            raise PipesplitError(f"the stage workers did not start: {why}")
        self.start_s = time.perf_counter() - t

    def _collect(self, timeout_s: float) -> list[Reply]:
        """One reply from every worker, or a ``Lost`` in place of the missing ones."""
        out: list[Reply | None] = [None] * len(self._conns)
        pending = set(range(len(self._conns)))
        deadline = time.monotonic() + timeout_s
        failed: int | None = None
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                for r in pending:
                    why = (f"rank {r} did not answer within {FATAL_GRACE_S:.0f}s of rank {failed}'s failure"
                           if failed is not None else f"rank {r} did not answer within {timeout_s:.0f}s (hung or deadlocked)")
                    out[r] = Lost(rank=r, why=why, dead=False)
                break
            waitables: list[Any] = [self._conns[r] for r in pending] + [self._procs[r].sentinel for r in pending]
            wait(waitables, timeout=left)
            for r in list(pending):
                try:
                    if self._conns[r].poll():
                        reply = self._conns[r].recv()
                        out[r] = reply
                        pending.discard(r)
                        if isinstance(reply, ErrorReply) and reply.fatal:
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
                    out[r] = Lost(rank=r, why=f"stage worker rank {r} (pid {self._procs[r].pid}) died ({how})", dead=True)
                    pending.discard(r)
        return [r for r in out if r is not None]

    def _broadcast(self, cmd: object) -> None:
        for conn in self._conns:
            try:
                conn.send(cmd)
            except (BrokenPipeError, OSError):
                pass  # the sentinel reports it

    def _run_trial(self, plan: SplitPlan, opts: TrialOptions, timeout_s: float) -> TrialResult:
        """The trial on the local workers; a broken group restarts the pool for the next trial."""
        if not self._procs:
            self.start()
        t = time.perf_counter()
        self._broadcast(RunTrial(plan=plan, options=opts))
        replies = self._collect(timeout_s)
        result, broken = result_from_replies(plan, replies, time.perf_counter() - t)
        if broken:
            self.restart()
        return result

    def _command(self, cmd: ProfileSegments | MeasureLink, timeout_s: float, what: str) -> list[Reply]:
        """Send one non-trial command to every rank; one reply per rank, or restart and raise."""
        if not self._procs:
            self.start()
        self._broadcast(cmd)
        replies = self._collect(timeout_s)
        bad = [r for r in replies if isinstance(r, (Lost, ErrorReply))]
        if bad or len(replies) != self.stages:
            self.restart()
            why = (bad[0].why if isinstance(bad[0], Lost) else bad[0].error) if bad else "a rank did not answer"
            raise PipesplitError(f"could not {what}: {why}")
        return replies

    def measure_link(self, sizes: list[int], repeats: int = 5, timeout_s: float = 300.0) -> list[tuple[int, float]]:
        """(bytes, median one-way seconds) between ranks 0 and 1 of this pool's real backend."""
        return link_samples(self._command(MeasureLink(sizes=tuple(sizes), repeats=repeats), timeout_s,
                                          "measure the link"))

    def profile(self, spec: ModelSpec, granularity: str, micro: list[int], repeats: int, warmup: int,
                timeout_s: float = 3600.0, streamed: bool = False) -> list[SegmentReply]:
        """Every rank times every segment at once (``pipeline.stage.probes.time_segments``; ``streamed``: one
        segment real at a time); one reply per rank."""
        cmd = ProfileSegments(spec=spec, granularity=granularity, micro=tuple(micro), repeats=repeats, warmup=warmup,
                              streamed=streamed)
        return [r for r in self._command(cmd, timeout_s, "profile in the stage workers") if isinstance(r, SegmentReply)]

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
        self._broadcast(Stop())
        for p in self._procs:
            p.join(timeout=5)
        self._kill()
