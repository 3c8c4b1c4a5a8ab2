"""The product's output document (``best_split.json`` shape): plan + measured + predicted + provenance."""

from __future__ import annotations

import json
import os
import platform
import socket
import tempfile
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from pipeline.plan import SplitPlan
from pipeline.result import TrialResult


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


def measured(result: TrialResult) -> dict[str, Any]:
    return {
        "ok": result.ok,
        "reason": result.reason,
        "speedup": result.speedup,
        "speedup_spread": list(result.speedup_spread),
        "speedup_all_threads": result.speedup_all,
        "serial_s": list(result.serial_s),
        "serial_all_threads_s": list(result.serial_all_s),
        "pipeline_s": list(result.pipeline_s),
        "stage_compute_s": list(result.stage_compute_s),
        "stage_comm_s": list(result.stage_comm_s),
        "boundary_bytes": list(result.boundary_bytes),
        "peak_mem_bytes": list(result.peak_mem_bytes),
        "max_abs_diff": result.max_abs_diff,
        "tolerance": result.tolerance,
        "events": [list(map(list, rank)) for rank in result.events],
        "comm_events": [list(map(list, rank)) for rank in result.comm_events],
    }


def document(plan: SplitPlan, result: TrialResult, *, predicted: dict[str, Any] | None = None,
             **prov: Any) -> dict[str, Any]:
    return {**plan.to_dict(), "measured": measured(result), "predicted": predicted or {},
            "provenance": provenance(**prov)}


def write_json(path: str | Path, data: Any) -> None:
    """Write atomically: a reader never sees a half-written file, a crash never leaves one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, default=float)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_figure(fig: Any, path: str | Path, dpi: int = 110) -> Path:
    """``fig.savefig`` atomically (a temp file beside it, then a rename), then close the figure."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=dpi)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
    return path
