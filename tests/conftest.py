"""Shared tiny models: real timm architectures, shrunk so a 2-stage gloo trial takes seconds."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from costmodel.types import Link, Profile, Segment
from pipeline.core.spec import ModelSpec
from pipeline.models.build import resolve_spec
from pipeline.stage.timeline import Timeline
from search.trials.report import PolicyRow

TINY_VIT = {"depth": 4, "img_size": 32, "patch_size": 8, "embed_dim": 48, "num_heads": 2, "num_classes": 10}
TINY_VIT_ARGS = ["--model", "deit_tiny_patch16_224", "--model-kwargs", json.dumps(TINY_VIT), "--batch-size", "8"]


@pytest.fixture(scope="session", autouse=True)
def quiet_library_logs():
    """torch's loggers at WARNING, as every CLI and stage worker sets them."""
    from pipeline.logs import quiet_logs

    quiet_logs()


@pytest.fixture(scope="session")
def tiny_spec() -> ModelSpec:
    return resolve_spec("deit_tiny_patch16_224", kwargs=TINY_VIT, batch_size=8)


@pytest.fixture(scope="session")
def pool2():
    """One 2-stage gloo pool shared by the whole session: start-up is paid once, as in a real search."""
    from pipeline.ranks.pool import StagePool

    with StagePool(2, threads_per_stage=1, quiet=True) as pool:
        yield pool


@pytest.fixture(scope="session")
def pool4():
    """A 4-rank gloo pool (2 stages x 2 replicas, plain FSDP on 4), started by the first test that asks."""
    from pipeline.ranks.pool import StagePool

    with StagePool(4, threads_per_stage=1, quiet=True) as pool:
        yield pool


@pytest.fixture(scope="session", autouse=True)
def shared_pool_and_profiles(pool2, tmp_path_factory):
    """Every command a test runs in this process uses the session's 2-stage pool (``lend_pool``), and every
    search or validation, here or in a subprocess, one profile cache (``$PIPESPLIT_PROFILE_DIR``): a tiny
    model is profiled once per shape, not once per test (nor once per pytest-xdist worker)."""
    import os

    from costmodel.types import PROFILE_DIR_ENV
    from pipeline.ranks.launch import lend_pool

    # pytest-xdist's workers (make test runs two) share one cache: a shape profiled by one is read by the other
    shared = os.environ.get("PYTEST_XDIST_WORKER") is not None
    base = tmp_path_factory.getbasetemp()
    os.environ[PROFILE_DIR_ENV] = str(base.parent / "profiles" if shared else tmp_path_factory.mktemp("profiles"))
    with lend_pool(pool2):
        yield
    os.environ.pop(PROFILE_DIR_ENV, None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def dashboard(storage: str, *extra: str):
    """A real optuna-dashboard on 127.0.0.1; yields its base URL once /api/studies answers."""
    port = free_port()
    exe = str(Path(sys.executable).parent / "optuna-dashboard")
    server = subprocess.Popen([exe, storage, *extra, "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"{base}/api/studies", timeout=2)
                break
            except OSError:
                time.sleep(0.2)
        else:
            pytest.fail("optuna-dashboard did not answer")
        yield base
    finally:
        server.terminate()
        server.wait(timeout=10)


# ---- plain builders shared by test modules (pure data, no processes) ----

def toy_profile(per_sample, out_bytes=0, batch=8, latency=0.0, bandwidth=1e9, overhead=0.0):
    segs = tuple(
        Segment(fqn=f"blocks.{i}", flops=100, param_bytes=4, out_bytes=out_bytes if i < len(per_sample) - 1 else 0,
                latency_s={m: t * m for m in (1, 2, 4, 8)})
        for i, t in enumerate(per_sample)
    )
    return Profile(model={"name": "toy"}, device="cpu", threads=1, granularity="block", batch_size=batch,
                   segments=segs, link=Link(latency_s=latency, bandwidth_Bps=bandwidth), step_overhead_s=overhead)


def good_timeline() -> Timeline:
    # 2 stages, 2 microbatches: rank 1 receives each microbatch after rank 0 computed it
    compute = [[(0, 0.0, 1.0), (1, 1.1, 2.0)], [(0, 1.2, 2.2), (1, 2.3, 3.0)]]
    comm = [[("send", 1.0, 1.05), ("send", 2.0, 2.05), ("send_wait", 2.1, 2.2)],
            [("recv", 0.0, 1.15), ("recv", 2.2, 2.25)]]
    return Timeline.from_events(compute, comm)


def report_row(**kw) -> PolicyRow:
    base = dict(stages=2, source="uniform", trial=3, best=False, split_points=("blocks.2",),
                stage_ranges=("patch_embed..blocks.1", "blocks.2..head"), chunks=4, predicted=1.8, measured=1.5,
                spread=(1.4, 1.6), compute_s=(1.0, 0.5), send_s=(0.05, 0.0), serial_s=1.5)
    base.update(kw)
    return PolicyRow(**base)
