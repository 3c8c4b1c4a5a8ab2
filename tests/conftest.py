"""Shared tiny models: real timm architectures, shrunk so a 2-stage gloo trial takes seconds."""

from __future__ import annotations

import json

import pytest

from pipeline.models import resolve_spec
from pipeline.spec import ModelSpec

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
