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

from pipeline.core.spec import ModelSpec
from pipeline.models import resolve_spec

TINY_VIT = {"depth": 4, "img_size": 32, "patch_size": 8, "embed_dim": 48, "num_heads": 2, "num_classes": 10}
TINY_VIT_ARGS = ["--model", "deit_tiny_patch16_224", "--model-kwargs", json.dumps(TINY_VIT), "--batch-size", "8"]


@pytest.fixture(scope="session")
def tiny_spec() -> ModelSpec:
    return resolve_spec("deit_tiny_patch16_224", kwargs=TINY_VIT, batch_size=8)


@pytest.fixture(scope="module")
def pool2():
    """One 2-stage gloo pool shared by a test module: start-up is paid once, as in a real search."""
    from pipeline.pool import StagePool

    with StagePool(2, threads_per_stage=1, quiet=True) as pool:
        yield pool


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
