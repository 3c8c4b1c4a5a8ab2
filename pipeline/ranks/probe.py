"""A stage rank's own memory before it makes its stage real, measured in a process started as the ranks are.

The ranks are forked from the pool's preloaded ``forkserver`` (``pipeline.ranks.pool.start_context``), so the
probe is too: it holds what a rank holds (the forkserver's imports, then the model on meta and its fake copy)
and starts in a fraction of a second where a fresh interpreter would import torch and the model's library
again (3-10 s here). Where workers are spawned, ``pipeline.models.footprint.rank_runtime`` runs the probe in a
fresh interpreter, as such a rank starts.
"""

from __future__ import annotations

import functools
from multiprocessing.connection import Connection

__all__ = ["rank_runtime"]

PROBE_TIMEOUT_S = 600.0


def _probe(spec_json: str, granularity: str, conn: Connection) -> None:
    """In the probe process: what a rank builds before its stage, its resident bytes sent back."""
    from pipeline.models.footprint import probe_resident

    try:
        conn.send(probe_resident(spec_json, granularity))
    except Exception as e:  # noqa: BLE001 - the caller falls back to a fresh interpreter's figure
        conn.send(repr(e))
    finally:
        conn.close()


@functools.lru_cache(maxsize=4)
def rank_runtime(spec_json: str, granularity: str = "block", device: str = "cpu") -> int:
    """What a stage rank of this process's pool holds before its stage is made (0 on CUDA, where the peak
    measured is what torch allocates): measured in a process forked as the ranks are."""
    from pipeline.models import footprint
    from pipeline.ranks.pool import start_context

    if device == "cuda":
        return 0
    ctx = start_context()
    if ctx.get_start_method() != "forkserver":
        return footprint.rank_runtime(spec_json, granularity, device)
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_probe, args=(spec_json, granularity, send), daemon=True)
    proc.start()
    send.close()
    try:
        got = recv.recv() if recv.poll(PROBE_TIMEOUT_S) else None
    except EOFError:
        got = None  # the probe died before it answered
    finally:
        recv.close()
        proc.join(5)
        if proc.is_alive():
            proc.kill()
    return got if isinstance(got, int) else footprint.rank_runtime(spec_json, granularity, device)
