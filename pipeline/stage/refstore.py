"""A study's reference on disk: the unsplit model's output, or its training step's loss and gradients, made once.

What a trial's check compares with depends on the model, the batch, the seed, the mode and the precision, never
on the split; the ranks keep it in memory for the trials they run (``RankState``), and this folder keeps it for
every later pool and process of the study (a restarted pool, a resumed search, a second search worker on the
same host). Each reference is two files named by its key's digest: ``<digest>.pt`` (the tensors, read back
memory-mapped, so a rank pages in only the gradients it compares) and ``<digest>.json`` (its key, the loss, and
every tensor's shape, dtype and CRC-32, written last). A file that is missing, truncated, of another key or whose
bytes do not match their CRC is not trusted: the reference is made again and both files rewritten. Both are
written whole or not at all (``pipeline.core.atomic``).
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.core.atomic import atomic_path, write_json

__all__ = ["VERSION", "StoredReference", "crc", "load", "reference_key", "save"]

VERSION = 1


@dataclass(frozen=True, kw_only=True)
class StoredReference:
    """What a reference file holds: tensors by name (the output under ``output``, or gradients by parameter
    name) and, for a training step, its loss."""

    tensors: dict[str, torch.Tensor]
    loss: float | None = None


def reference_key(spec_key: str, kind: str, device: str, variant: str = "", checkpoint: str | None = None) -> str:
    """Everything a reference depends on: the model build with its batch and seed (``ModelSpec.key``), the
    checkpoint's size and modification time where its weights come from one (a file rewritten at the same path
    is another model), what it is (``output`` or ``step``), how it computed (``variant``: mixed precision's
    way), the device type and torch."""
    weights: list[int | str] | None = None
    if checkpoint:
        try:
            st = os.stat(checkpoint)
            weights = [st.st_size, st.st_mtime_ns]
        except OSError:
            weights = ["unreadable"]
    return json.dumps({"model": spec_key, "kind": kind, "variant": variant, "device": device, "weights": weights,
                       "torch": torch.__version__.split("+")[0], "version": VERSION}, sort_keys=True)


def _paths(folder: str | Path, key: str) -> tuple[Path, Path]:
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return Path(folder) / f"{digest}.pt", Path(folder) / f"{digest}.json"


def crc(t: torch.Tensor) -> int:
    """CRC-32 of a tensor's bytes, whatever its dtype."""
    flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
    return zlib.crc32(flat.cpu().numpy().data) & 0xFFFFFFFF


def save(folder: str | Path, key: str, ref: StoredReference) -> None:
    """Write ``ref`` under ``key``: the tensors first, then the manifest that vouches for them."""
    data, manifest = _paths(folder, key)
    cpu = {n: t.detach().cpu().contiguous() for n, t in ref.tensors.items()}
    with atomic_path(data) as tmp:
        torch.save(cpu, tmp)
    write_json(manifest, {"key": key, "loss": ref.loss, "bytes": data.stat().st_size,
                          "tensors": {n: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
                                          "crc32": crc(t)} for n, t in cpu.items()}})


def load(folder: str | Path, key: str, names: frozenset[str] | None = None,
         device: torch.device | None = None) -> StoredReference | None:
    """The reference stored under ``key`` holding (at least) ``names`` (None: all it holds), each tensor's bytes
    checked against its CRC; None where there is none, or it cannot be trusted (the caller makes it again)."""
    data, manifest = _paths(folder, key)
    try:
        doc = json.loads(manifest.read_text())
        if doc.get("key") != key or data.stat().st_size != doc.get("bytes"):
            return None
        listed: dict[str, dict[str, object]] = doc["tensors"]
        wanted = set(listed) if names is None else set(names)
        if not wanted <= set(listed):
            return None
        held = torch.load(data, map_location="cpu", weights_only=True, mmap=True)
        out: dict[str, torch.Tensor] = {}
        for n in wanted:
            t, want = held.get(n), listed[n]
            if (not isinstance(t, torch.Tensor) or list(t.shape) != want["shape"]
                    or str(t.dtype).removeprefix("torch.") != want["dtype"] or crc(t) != want["crc32"]):
                return None
            out[n] = t if device is None or device.type == "cpu" else t.to(device)
        loss = doc.get("loss")
        return StoredReference(tensors=out, loss=None if loss is None else float(loss))
    except Exception:  # noqa: BLE001 - missing, truncated, unreadable or not ours: made again, never trusted
        return None
