"""The product's output document (``best_split.json`` shape): plan + measured + predicted + provenance."""

from __future__ import annotations

import os
import platform
import socket
from datetime import datetime, timezone
from importlib import metadata
from typing import Any

from pipeline.core.plan import SplitPlan
from pipeline.core.result import TrialResult


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(**extra: Any) -> dict[str, Any]:
    """Where and with what a figure was measured."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "host": socket.gethostname(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "gpu": gpu,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "timm": _version("timm"),
        "torchpippy": _version("torchpippy"),
        "pipesplit": _version("pipesplit"),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **extra,
    }


def document(plan: SplitPlan, result: TrialResult, *, predicted: dict[str, Any] | None = None,
             **prov: Any) -> dict[str, Any]:
    """A ``best_split.json``-shaped document: the plan's keys, then measured, predicted and provenance."""
    return {**plan.to_dict(), "measured": result.measured(), "predicted": predicted or {},
            "provenance": provenance(**prov)}
