"""What a rank measures while a trial runs: peak memory, compute spans per microbatch, send/recv spans.

The p2p spans come from wrapping torch's schedule-level ``_batch_p2p`` / ``_wait_batch_p2p`` and
torchpippy's per-chunk receive and send: private hooks of both runtimes, kept here and nowhere else.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from pipeline.stage.reference import trim_heap

Span = tuple[int, float, float]
"""(microbatch, start, end) seconds from a run's start."""
CommSpan = tuple[str, float, float]
"""(kind, start, end): ``send`` (post), ``send_wait``, ``recv`` (post to end of wait)."""


class Peak:
    """Peak memory of this process over a window: VmHWM reset through clear_refs, or CUDA's counter."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.base = 0
        """Memory held when the window opened (resident on CPU, allocated on CUDA)."""

    def reset(self) -> None:
        """Open a window: the peak starts again from what is held now."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = int(torch.cuda.memory_allocated(self.device))
            return
        trim_heap()  # the resident size a peak starts from is what is held, not what an earlier step freed
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
        self.base = self._status("VmRSS:")

    @staticmethod
    def _status(field: str) -> int:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith(field):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

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


class ComputeClock:
    """Forward hooks on the stage module: compute spans per microbatch and the bytes it outputs."""

    def __init__(self, modules: nn.Module | Sequence[nn.Module], device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.spans: list[tuple[Any, Any]] = []
        self.out_bytes = 0
        self._start: Any = None
        mods = [modules] if isinstance(modules, nn.Module) else list(modules)
        self._handles = [h for m in mods for h in (m.register_forward_pre_hook(self._pre),
                                                   m.register_forward_hook(self._post))]

    def now(self) -> Any:
        """A time stamp on this rank's clock: a recorded CUDA event, or ``perf_counter`` on CPU."""
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            ev.record()
            return ev
        return time.perf_counter()

    def _pre(self, mod: nn.Module, args: Any) -> None:
        self._start = self.now()

    def _post(self, mod: nn.Module, args: Any, out: Any) -> None:
        self.spans.append((self._start, self.now()))
        self.out_bytes += sum(t.numel() * t.element_size() for t in tree_leaves(out) if isinstance(t, torch.Tensor))

    def reset(self) -> None:
        self.spans.clear()
        self.out_bytes = 0

    def resolve(self, t0: Any) -> list[Span]:
        """Spans as (microbatch, start, end) seconds from ``t0`` (a perf_counter value or CUDA event)."""
        return [(i, *since(t0, a, b, self.cuda)) for i, (a, b) in enumerate(self.spans)]

    def close(self) -> None:
        for h in self._handles:
            h.remove()


def since(t0: Any, a: Any, b: Any, cuda: bool) -> tuple[float, float]:
    if cuda:
        return t0.elapsed_time(a) / 1e3, t0.elapsed_time(b) / 1e3
    return a - t0, b - t0


class CommClock:
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

    def resolve(self, t0: Any, cuda: bool) -> list[CommSpan]:
        return [(k, *since(t0, a, b, cuda)) for k, a, b in self.spans]


class HasComm(Protocol):
    """The rank state's slot for the comm clock of the trial that is running (None between trials)."""

    comm: CommClock | None


def hook_torch_p2p(state: HasComm) -> None:
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
        if clock is None or tag is None:
            wait(works)
            return None
        a = clock.now()
        wait(works)
        b = clock.now()
        clock.add(tag[0], tag[1] if tag[0] == "recv" else a, b)
        return None

    sched._batch_p2p, sched._wait_batch_p2p = timed_post, timed_wait  # type: ignore[assignment]
    sched._pipesplit_hooked = True  # type: ignore[attr-defined]


def hook_pippy_p2p(runtime: Any, clock: CommClock, rank: int, world: int) -> None:
    """Time torchpippy's per-chunk receive (post + wait) and send (post) on this rank's stage; hooking a
    stage again (a resumed trial) replaces the earlier clock rather than wrapping it."""
    if not hasattr(runtime, "_pipesplit_p2p"):
        runtime._pipesplit_p2p = (runtime._recv_and_fill_inputs, runtime._send_activations)
    recv, send = runtime._pipesplit_p2p

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


class quiet_stderr:
    """Silence file descriptor 2 for a moment: kineto logs every profiler start/stop there from C++."""

    def __enter__(self) -> None:
        sys.stderr.flush()
        self.saved = os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)

    def __exit__(self, *exc: object) -> None:
        os.dup2(self.saved, 2)
        os.close(self.saved)
