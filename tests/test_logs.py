"""pipeline.logs: torch's loggers stay at WARNING, so an export logs nothing a failing test would print."""

import logging

import torch

from pipeline.logs import LOUD_LOGGERS, quiet_logs


def test_an_export_logs_nothing_below_warning_once_quieted(caplog):
    quiet_logs()
    caplog.set_level(logging.DEBUG)  # the root as low as it goes: only the libraries' own levels hold them back
    torch.export.export(torch.nn.Linear(4, 2), (torch.randn(1, 4),))
    loud = [r for r in caplog.records if r.name.startswith("torch") and r.levelno < logging.WARNING]
    assert loud == []
    assert all(logging.getLogger(n).getEffectiveLevel() == logging.WARNING for n in LOUD_LOGGERS)
