"""Atomic writes, one way for every file pipesplit leaves: a temp file beside the target, then a rename.

A reader never sees a half-written file and a crash never leaves one; a folder that cannot be written
is one ``PipesplitError`` line naming it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipesplitError

__all__ = ["atomic_path", "check_writable", "save_figure", "write_json", "write_text", "write_with"]


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success it replaces ``path``, on any error it is removed."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix or ".tmp")
    except OSError as e:
        raise PipesplitError(f"cannot write {path} ({e.strerror or e}): pick a writable folder") from None
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a result is as readable as any other file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_writable(path: str | Path, *, folder: bool = False) -> Path:
    """Fail before any work when ``path`` (a file, or with ``folder`` a directory) could not be written."""
    path = Path(path)
    target = path if folder else path.parent
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PipesplitError(f"cannot write {path} ({e.strerror or e}): pick a writable folder") from None
    if not os.access(target, os.W_OK | os.X_OK) or (not folder and path.is_dir()):
        why = "it is a folder" if not folder and path.is_dir() else f"{target} is not writable"
        raise PipesplitError(f"cannot write {path} ({why}): pick a writable path")
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text(path: str | Path, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_json(path: str | Path, data: Any) -> Path:
    """JSON with indent 2 and a final newline; floats that are numpy scalars are written as floats."""
    return write_text(path, json.dumps(data, indent=2, default=float) + "\n")


def write_with(path: str | Path, writer: Callable[[Path], Any]) -> Path:
    """Atomically write whatever ``writer(tmp_path)`` writes (a DataFrame's ``to_csv``, say)."""
    with atomic_path(path) as tmp:
        writer(tmp)
    return Path(path)


def save_figure(fig: Any, path: str | Path, dpi: int = 110) -> Path:
    """``fig.savefig`` atomically, then close the figure."""
    import matplotlib.pyplot as plt

    try:
        return write_with(path, lambda tmp: fig.savefig(tmp, dpi=dpi))
    finally:
        plt.close(fig)
