"""One local stage worker process: join the group, then answer the driver's commands until ``Stop``.

The commands and what they run are in ``pipeline.ranks.protocol``; the state a worker keeps across trials is
``pipeline.stage.rank.RankState``. A driver that dies closes the pipe: the worker then leaves quietly.
"""

from __future__ import annotations

import signal
import sys
from multiprocessing.connection import Connection

import torch.distributed as dist

from pipeline.ranks.protocol import Configure, Stop, handle
from pipeline.stage.messages import ErrorReply, Ready
from pipeline.stage.rank import WorkerConfig, join_group, one_line

__all__ = ["worker_main"]


def worker_main(rank: int, cfg: WorkerConfig, conn: Connection) -> None:
    """Process entry point: join the group, then answer the driver's messages until ``Stop``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver owns Ctrl-C and shuts the pool down
    try:
        state = join_group(rank, cfg)
        conn.send(Ready(rank=rank))
    except Exception as e:  # noqa: BLE001
        _send_quietly(conn, ErrorReply(rank=rank, error=f"rank {rank} could not join the process group: {one_line(e)}"))
        return
    try:
        while True:
            cmd = conn.recv()
            if isinstance(cmd, Stop):
                break
            if isinstance(cmd, Configure):
                continue
            conn.send(handle(state, cmd))
    except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
        # the driver is gone (killed, say): nothing is waiting for a reply, so leave without a traceback
        print(f"pipesplit stage worker rank {rank}: the driver went away; exiting", file=sys.stderr)
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass


def _send_quietly(conn: Connection, msg: object) -> None:
    try:
        conn.send(msg)
    except (BrokenPipeError, OSError):
        pass
