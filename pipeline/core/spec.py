"""ModelSpec: which model, how built, fed with what; plain data that crosses process and package lines."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline.core.errors import PipesplitError
from pipeline.core.fields import int_list, read

SPEC_VERSION = 1
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A randomly initialised (or checkpoint-loaded) timm model and the batch it is run on."""

    name: str
    """timm model name, e.g. ``deit_small_patch16_224``."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword overrides for ``timm.create_model`` (``depth``, ``embed_dim``, ``img_size`` ...)."""
    batch_size: int = 32
    """Samples in the whole batch that the pipeline splits into chunks."""
    input_shape: tuple[int, ...] = (3, 224, 224)
    """One sample's shape, derived from the model's config by ``pipeline.models.resolve_spec``."""
    dtype: str = "float32"
    """Parameter and input dtype."""
    checkpoint: str | None = None
    """Optional local ``state_dict`` file; weights do not change timing, so none is needed."""
    seed: int = 0
    """Seed for weights and inputs, identical on every rank."""

    def __post_init__(self) -> None:
        if not self.name:
            raise PipesplitError("model name is empty: pass a timm model name such as deit_small_patch16_224")
        if self.batch_size < 1:
            raise PipesplitError(f"batch size must be a positive integer (got {self.batch_size})")
        if self.dtype not in DTYPES:
            raise PipesplitError(f"dtype {self.dtype!r} is not supported: use one of {', '.join(DTYPES)}")
        if not self.input_shape or any(int(d) < 1 for d in self.input_shape):
            raise PipesplitError(f"input shape {self.input_shape} must be positive dimensions, e.g. (3, 224, 224)")
        object.__setattr__(self, "input_shape", tuple(int(d) for d in self.input_shape))

    @property
    def key(self) -> str:
        """A stable string naming this exact model build, for caches."""
        return json.dumps(
            {k: v for k, v in self.to_dict().items() if k != "version"}, sort_keys=True, separators=(",", ":")
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["input_shape"] = list(self.input_shape)
        d["version"] = SPEC_VERSION
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSpec:
        if not isinstance(d, dict) or "name" not in d:
            raise PipesplitError(f"model entry {d!r} is not a model spec: it needs at least a 'name'")
        version = d.get("version", SPEC_VERSION)
        if version != SPEC_VERSION:
            raise PipesplitError(f"model spec version {version!r} is not supported (this pipesplit reads {SPEC_VERSION})")
        w = "model."
        args: dict[str, Any] = {
            "name": read(d, "name", str, where=w), "kwargs": dict(read(d, "kwargs", dict, {}, where=w)),
            "batch_size": read(d, "batch_size", int, 32, where=w), "dtype": read(d, "dtype", str, "float32", where=w),
            "checkpoint": read(d, "checkpoint", str, None, where=w, optional=True),
            "seed": read(d, "seed", int, 0, where=w),
        }
        if "input_shape" in d:
            args["input_shape"] = int_list(d["input_shape"], "model.input_shape")
        return cls(**args)
