"""ModelSpec: which model, how built, fed with what; plain data that crosses process and package lines."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline.core.errors import PipesplitError
from pipeline.core.fields import int_list, read

SPEC_VERSION = 1
MIXED_SPEC_VERSION = 2
"""A spec that computes in mixed precision says version 2, so a pipesplit that cannot run it refuses it rather
than running it in full precision; every other spec stays version 1 (and its cache keys as they were)."""
MIXED_PRECISIONS = ("bf16",)
DTYPES = ("float32", "bfloat16", "float16")
SOURCES = ("timm", "hf", "factory")
INPUT_DTYPES = ("int64", "int32", "bool")
"""Input dtypes other than the model's own float dtype (token ids, masks)."""


@dataclass(frozen=True, kw_only=True)
class TensorSpec:
    """One more input tensor of the model's forward (after the first): per-sample shape, dtype, range."""

    shape: tuple[int, ...]
    """One sample's shape; () for one value per sample."""
    dtype: str | None = None
    """``int64``, ``int32`` or ``bool``; None: a float input in the model's dtype, drawn from N(0, 1)."""
    low: int = 0
    high: int | None = None
    """Integer inputs are drawn uniformly from [``low``, ``high``)."""

    def __post_init__(self) -> None:
        _check_input(self.shape, self.dtype, self.low, self.high, scalar=True)
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    def to_dict(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype, "low": self.low, "high": self.high}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> TensorSpec:
        if not isinstance(d, dict) or "shape" not in d:
            raise PipesplitError(f"{where} {d!r} must be an object with a 'shape' (and dtype, low, high)")
        return cls(shape=int_list(d["shape"], f"{where}.shape"),
                   dtype=read(d, "dtype", str, None, where=f"{where}.", optional=True),
                   low=read(d, "low", int, 0, where=f"{where}."),
                   high=read(d, "high", int, None, where=f"{where}.", optional=True))


def _check_input(shape: tuple[int, ...], dtype: str | None, low: int, high: int | None, scalar: bool = False) -> None:
    """One line for an input description no batch can be drawn from."""
    if dtype is not None and dtype not in INPUT_DTYPES:
        raise PipesplitError(f"input dtype {dtype!r} is not supported: use one of "
                             f"{', '.join(INPUT_DTYPES)} (or none for a float input)")
    if dtype in ("int64", "int32") and (high is None or high <= low):
        raise PipesplitError(f"integer input needs input_high > input_low (got [{low}, {high})): "
                             "give the value range, e.g. the vocabulary size")
    if (not shape and not scalar) or any(int(d) < 1 for d in shape):
        raise PipesplitError(f"input shape {shape} must be positive dimensions, e.g. (3, 224, 224)")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A randomly initialised (or checkpoint-loaded) model and the batch it is run on, rebuildable anywhere."""

    name: str
    """timm model name (``deit_small_patch16_224``), transformers model type (``gpt2``) or factory import
    path (``my_pkg.models:build`` or ``path/to/file.py:build``), as ``source`` says."""
    source: str = "timm"
    """Where the model comes from: ``timm``, ``hf`` (transformers, from its config) or ``factory``."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword overrides for ``timm.create_model``, the transformers config, or the factory."""
    batch_size: int = 32
    """Samples in the whole batch that the pipeline splits into chunks."""
    input_shape: tuple[int, ...] = (3, 224, 224)
    """One sample's shape, derived from the model's config by ``pipeline.models.build.resolve_spec``."""
    dtype: str = "float32"
    """Parameter dtype, and the input's unless ``input_dtype`` says otherwise."""
    input_dtype: str | None = None
    """An integer or bool input (``int64`` token ids); None: a float input in ``dtype``, drawn from N(0, 1)."""
    input_high: int | None = None
    """Integer inputs are drawn uniformly from [``input_low``, ``input_high``) (a vocabulary's size)."""
    input_low: int = 0
    extra_inputs: tuple[TensorSpec, ...] = ()
    """The forward's further positional inputs (an attention mask, positions), each batched on dim 0."""
    checkpoint: str | None = None
    """Optional local ``state_dict`` file; weights do not change timing, so none is needed."""
    seed: int = 0
    """Seed for weights and inputs, identical on every rank."""
    mixed_precision: str | None = None
    """``bf16``: float32 weights (the optimizer's master copy) computing in bfloat16, as users train: FSDP2's
    ``MixedPrecisionPolicy`` on a sharded mesh, ``torch.autocast`` otherwise (``pipeline.stage.precision``)."""

    def __post_init__(self) -> None:
        if not self.name:
            raise PipesplitError("model name is empty: pass a timm model name such as deit_small_patch16_224, "
                                 "hf:<model type> or --model-factory module:function")
        if self.source not in SOURCES:
            raise PipesplitError(f"model source {self.source!r} is unknown: use one of {', '.join(SOURCES)}")
        _check_input(self.input_shape, self.input_dtype, self.input_low, self.input_high)
        if self.batch_size < 1:
            raise PipesplitError(f"batch size must be a positive integer (got {self.batch_size})")
        if self.dtype not in DTYPES:
            raise PipesplitError(f"dtype {self.dtype!r} is not supported: use one of {', '.join(DTYPES)}")
        if self.mixed_precision is not None:
            if self.mixed_precision not in MIXED_PRECISIONS:
                raise PipesplitError(f"mixed precision {self.mixed_precision!r} is not supported: use "
                                     f"{' or '.join(MIXED_PRECISIONS)}, or leave --mixed-precision out")
            if self.dtype != "float32":
                raise PipesplitError(f"--mixed-precision {self.mixed_precision} keeps float32 weights and computes in "
                                     f"bfloat16, but --dtype is {self.dtype}: use --dtype float32 (the default)")
        object.__setattr__(self, "input_shape", tuple(int(d) for d in self.input_shape))
        object.__setattr__(self, "extra_inputs", tuple(self.extra_inputs))

    @property
    def label(self) -> str:
        """The model as a user names it: ``deit_small_patch16_224``, ``hf:gpt2``, ``my_pkg.models:build``."""
        return f"hf:{self.name}" if self.source == "hf" else self.name

    @property
    def slug(self) -> str:
        """``label`` made safe for a file or study name."""
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", self.label).strip("-") or "model"

    @property
    def key(self) -> str:
        """A stable string naming this exact model build, for caches."""
        return json.dumps(
            {k: v for k, v in self.to_dict().items() if k != "version"}, sort_keys=True, separators=(",", ":")
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["input_shape"] = list(self.input_shape)
        if self.extra_inputs:  # left out when none, so single-input specs (and their cache keys) stay as they were
            d["extra_inputs"] = [t.to_dict() for t in self.extra_inputs]
        else:
            del d["extra_inputs"]
        if self.mixed_precision is None:  # left out, so full-precision specs (and their cache keys) stay as they were
            del d["mixed_precision"]
        d["version"] = SPEC_VERSION if self.mixed_precision is None else MIXED_SPEC_VERSION
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSpec:
        if not isinstance(d, dict) or "name" not in d:
            raise PipesplitError(f"model entry {d!r} is not a model spec: it needs at least a 'name'")
        version = d.get("version", SPEC_VERSION)
        if version not in (SPEC_VERSION, MIXED_SPEC_VERSION):
            raise PipesplitError(f"model spec version {version!r} is not supported (this pipesplit reads "
                                 f"{SPEC_VERSION} and {MIXED_SPEC_VERSION})")
        w = "model."
        args: dict[str, Any] = {
            "name": read(d, "name", str, where=w), "source": read(d, "source", str, "timm", where=w),
            "input_dtype": read(d, "input_dtype", str, None, where=w, optional=True),
            "input_high": read(d, "input_high", int, None, where=w, optional=True),
            "input_low": read(d, "input_low", int, 0, where=w), "kwargs": dict(read(d, "kwargs", dict, {}, where=w)),
            "batch_size": read(d, "batch_size", int, 32, where=w), "dtype": read(d, "dtype", str, "float32", where=w),
            "checkpoint": read(d, "checkpoint", str, None, where=w, optional=True),
            "seed": read(d, "seed", int, 0, where=w),
            "mixed_precision": read(d, "mixed_precision", str, None, where=w, optional=True),
        }
        if "input_shape" in d:
            args["input_shape"] = int_list(d["input_shape"], "model.input_shape")
        extra = d.get("extra_inputs", [])
        if not isinstance(extra, list):
            raise PipesplitError(f"model.extra_inputs {extra!r} must be a list of input objects")
        args["extra_inputs"] = tuple(TensorSpec.from_dict(t, f"model.extra_inputs[{i}]") for i, t in enumerate(extra))
        return cls(**args)
