"""Open Optuna storage from a URL or a journal file path, failing in one line when it cannot."""

from __future__ import annotations

import random
import time
import warnings
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipesplitError

JOURNAL_SUFFIXES = (".log", ".jsonl", ".journal")
SCHEMA_RETRIES = 4


def is_journal(url: str) -> bool:
    return url.startswith("journal:") or url.endswith(JOURNAL_SUFFIXES)


def open_storage(url: str, *, heartbeat_interval: int | None = 60) -> Any:
    """An Optuna storage: ``sqlite:///...``, ``postgresql://...`` (RDB, with heartbeats) or a journal file."""
    import optuna

    if is_journal(url):
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        path = Path(url.removeprefix("journal:"))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            return JournalStorage(JournalFileBackend(str(path)))
        except OSError as e:
            raise PipesplitError(f"journal file {path} cannot be opened ({e.strerror}): pick a writable path") from None
    if "://" not in url:
        raise PipesplitError(
            f"storage {url!r} is neither a database URL (sqlite:///results/optuna.db, postgresql://user@host/db) "
            "nor a journal file ending in .log"
        )
    if url.startswith("sqlite:///"):
        db = Path(url.removeprefix("sqlite:///"))
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise PipesplitError(f"storage {url} cannot be created ({e.strerror}): pick a writable path") from None
    for attempt in range(SCHEMA_RETRIES):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeats are what we want
                return optuna.storages.RDBStorage(
                    url, heartbeat_interval=heartbeat_interval,
                    grace_period=None if heartbeat_interval is None else 10 * heartbeat_interval,
                    engine_kwargs={"pool_pre_ping": True} if not url.startswith("sqlite") else None,
                )
        except ImportError as e:
            raise _import_hint(url, e) from None
        except Exception as e:  # noqa: BLE001 - sqlalchemy raises many kinds; the user needs one line
            # workers that start together on an empty database race to create Optuna's tables: the loser
            # sees a duplicate key; by the next attempt the tables exist
            text = str(e).lower()
            if attempt + 1 < SCHEMA_RETRIES and ("duplicate" in text or "already exists" in text):
                time.sleep(0.5 + random.random())
                continue
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise PipesplitError(f"storage {url} is unreachable: {first[:300]}") from None
    raise AssertionError("unreachable")  # pragma: no cover


def _import_hint(url: str, e: ImportError) -> PipesplitError:
    """One line for a missing database driver (optuna re-raises the driver's error without its name)."""
    driver = getattr(e, "name", None) or getattr(e.__cause__, "name", None) or "database driver"
    hint = "pip install 'psycopg[binary]' (or: pip install -e '.[postgres]')" if url.startswith("postgres") \
        else f"install the Python driver that provides {driver}"
    return PipesplitError(f"storage {url} needs the {driver} module: {hint}, or use sqlite/a journal file")
