"""Optuna storage from a URL or a journal path; every way it cannot be opened is one line."""

import pytest

from pipeline.core.errors import PipesplitError
from search.trials.storage import is_journal, open_storage


def test_journal_paths_and_sqlite_urls_open(tmp_path):
    import optuna

    assert is_journal("results/study.log") and is_journal("journal:x") and not is_journal("sqlite:///x.db")
    assert isinstance(open_storage(str(tmp_path / "j" / "s.log")), optuna.storages.JournalStorage)
    assert isinstance(open_storage(f"sqlite:///{tmp_path}/o.db", heartbeat_interval=None), optuna.storages.RDBStorage)


@pytest.mark.parametrize("url, message", [
    ("not-a-url", "is neither a database URL"),
    ("sqlite:////proc/no/such/dir/o.db", "cannot be created"),
    ("mysql+nodriver://x@127.0.0.1:1/db", r"storage mysql\+nodriver"),
    ("postgresql://nobody@127.0.0.1:1/x", "storage postgresql://nobody@127.0.0.1:1/x is unreachable"),
])
def test_storage_that_cannot_be_opened_is_one_line(url, message):
    with pytest.raises(PipesplitError, match=message) as e:
        open_storage(url)
    assert "\n" not in str(e.value)
