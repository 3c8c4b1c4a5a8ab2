"""Library loggers kept at WARNING: torch's structured-trace logger speaks at DEBUG on every export,
which floods a test's captured logs and a user's terminal with lines nobody asked for."""

from __future__ import annotations

import logging

__all__ = ["HANDLED", "LOUD_LOGGERS", "quiet_logs"]

LOUD_LOGGERS = ("torch", "torch.__trace", "torch.export", "torch._dynamo", "torch.fx", "torch.distributed",
                "torch.distributed.pipelining", "torch._export", "torch.utils._sympy", "fvcore", "timm",
                "transformers")
"""Loggers of the libraries pipesplit drives, set to WARNING (each explicitly: torch sets some of its own)."""


HANDLED = ("torch._subclasses.fake_tensor",)
"""Loggers that report at ERROR what pipesplit catches and says itself in one line: a model that cannot run
on fake tensors (``pipeline.models.weights.with_forward``)."""


def quiet_logs(level: int = logging.WARNING) -> None:
    """Set every library logger pipesplit drives to ``level`` (WARNING): what they say below it is noise here;
    the ones whose errors pipesplit handles itself to CRITICAL."""
    for name in LOUD_LOGGERS:
        logging.getLogger(name).setLevel(level)
    for name in HANDLED:
        logging.getLogger(name).setLevel(max(level, logging.CRITICAL))
