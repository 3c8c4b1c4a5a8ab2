"""The frameworks' rules' answers, remembered in a folder (a search keeps them beside its profiles).

Running torchtitan's, Megatron-Core's and DeepSpeed's own split code means importing them: ~2.4 s of every
search process here (a quarter of a tiny search's driver), for a few integers that depend only on the model's
segments, the stage count, the framework's version and our mapping code. So each answer (the cuts, or the
framework's refusal) is written down the first time that framework's code gives it, keyed by all of those,
and read back after: no figure is made up, and a new framework version, a new model or an edited
``pipeline.peers.rules`` asks the framework again. A missing framework is never remembered (installing it
must take effect), nor is a file that cannot be read trusted (it is asked again and rewritten).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from pipeline.core.atomic import write_json
from pipeline.core.policies import Policy, PolicyInputs
from pipeline.core.stack import NoStack
from pipeline.peers import rules
from pipeline.peers.rules import FRAMEWORKS

__all__ = ["FILE", "RememberedRules", "framework_version"]

FILE = "peer_rules.json"
"""The file in the folder: {key: {"cuts": [...]} or {"refused": "why"}}."""


def framework_version(framework: str) -> str | None:
    """The installed version of ``framework``'s distribution (read from its metadata, nothing imported)."""
    try:
        return metadata.version(FRAMEWORKS[framework])
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def _our_code() -> str:
    """Our mapping of each framework's answer onto cuts, as it is now: an edit asks the frameworks again."""
    return hashlib.sha256(Path(rules.__file__).read_bytes()).hexdigest()[:16]


@dataclass(frozen=True, kw_only=True)
class RememberedRules:
    """A framework policy's cuts from ``folder`` where its own code gave them before, else from its code (then
    written down); any other policy, or ``folder`` None, is computed as it is."""

    folder: str | None

    def cuts(self, policy: Policy, inputs: PolicyInputs, stages: int) -> list[int]:
        """``policy.cuts(inputs, stages)``, or what it returned (or the ValueError it raised) before."""
        version = framework_version(policy.framework) if policy.framework is not None else None
        if self.folder is None or version is None:
            return policy.cuts(inputs, stages)  # not a framework's, or not installed: PeerMissing says so
        key = self._key(policy, version, inputs, stages)
        known = self._read().get(key)
        if isinstance(known, dict) and isinstance(known.get("cuts"), list):
            return [int(c) for c in known["cuts"]]
        if isinstance(known, dict) and isinstance(known.get("refused"), str):
            raise ValueError(known["refused"])
        try:
            cuts = policy.cuts(inputs, stages)
        except (rules.PeerMissing, NoStack):
            raise  # an install that does not import (asked again next time); a model without one stack (ours)
        except ValueError as e:
            self._write(key, {"refused": str(e)})
            raise
        self._write(key, {"cuts": [int(c) for c in cuts]})
        return cuts

    def _key(self, policy: Policy, version: str, inputs: PolicyInputs, stages: int) -> str:
        # what the frameworks' rules read: the segments' names and sizes, PiPPy's units (never measured times)
        what = [policy.name, policy.framework, version, _our_code(), stages, list(inputs.segment_names),
                list(inputs.segment_elements), list(inputs.unit_elements)]
        return hashlib.sha256(json.dumps(what).encode()).hexdigest()

    @property
    def path(self) -> Path:
        assert self.folder is not None
        return Path(self.folder) / FILE

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}  # none yet, or unreadable: asked again, and rewritten
        return data if isinstance(data, dict) else {}

    def _write(self, key: str, entry: dict[str, Any]) -> None:
        try:
            write_json(self.path, {**self._read(), key: entry})
        except Exception:  # noqa: BLE001 - a folder that cannot be written only costs the next search the imports
            pass
