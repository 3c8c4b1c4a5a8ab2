"""What a rank keeps between trials: the real tensors of its last stage, by name, for the next plan to reuse.

A tensor's values depend on (the model, the seed, its name), never on the split (``pipeline.models.meta``),
so a plan that gives a rank tensors it already holds can take them as they are. Before a plan's tensors are
made, those it does not need are let go (``keep_only``), so the rank never holds the old stage beside the
new one: its peak stays what the new plan alone needs. Forward-only trials keep their tensors; a training
step changes its parameters in place, so training keeps nothing (``clear``).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from pipeline.models.meta import MetaModel, storage_key

__all__ = ["KeptTensors"]


class KeptTensors:
    """A rank's real tensors by name on its device, made for one trial's stage and reused by the next."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.reused_bytes = 0
        """Bytes the last ``materialise`` took from what was kept rather than made."""

    def clear(self) -> None:
        """Keep nothing (a new model, or a training trial whose step changes its parameters in place)."""
        self.tensors.clear()
        self.reused_bytes = 0

    def keep_only(self, names: Iterable[str]) -> int:
        """Let go of every kept tensor not named in ``names``; returns the bytes whose last holder that was."""
        wanted = set(names)
        gone = {n: t for n, t in self.tensors.items() if n not in wanted}
        for n in gone:
            del self.tensors[n]
        live = {storage_key(t) for t in self.tensors.values()}
        return sum({storage_key(t): t.untyped_storage().nbytes() for t in gone.values()
                    if storage_key(t) not in live}.values())

    def materialise(self, meta: MetaModel, names: Iterable[str], device: torch.device) -> dict[str, torch.Tensor]:
        """Real tensors for ``names`` on ``device``: the kept ones as they are, the rest made by ``meta`` and kept."""
        wanted = list(dict.fromkeys(names))
        have = [n for n in wanted if n in self.tensors and self.tensors[n].device == device]
        missing = [n for n in wanted if n not in have]
        self.reused_bytes = sum({storage_key(self.tensors[n]): self.tensors[n].untyped_storage().nbytes()
                                 for n in have}.values())
        if missing:
            self.tensors.update(meta.materialise(missing, device))
        return {n: self.tensors[n] for n in wanted}
