"""Build any model a ModelSpec names, and its batch: random weights (no downloads), an optional local checkpoint.

Three sources: timm (the default), ``hf:<type>`` (``pipeline.models.hf``) and a user's factory (``pipeline.models.factory``).
"""

from __future__ import annotations

import difflib
import warnings
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.core.errors import PipesplitError
from pipeline.core.spec import ModelSpec, TensorSpec
from pipeline.models.fake import fake_model
from pipeline.models.meta import MetaModel, build_meta, from_eager
from pipeline.models.weights import checkpoint_reader, whole_model


def _check_name(name: str) -> None:
    import timm

    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise PipesplitError(f"unknown timm model {name!r}{hint}: pass a name from timm.list_models()")


def _create(spec: ModelSpec) -> nn.Module:
    """A fresh model of ``spec``'s source (the caller seeds torch first)."""
    if spec.source == "hf":
        from pipeline.models.hf import build_hf

        return build_hf(spec.name, dict(spec.kwargs))
    if spec.source == "factory":
        from pipeline.models.factory import build_factory

        return build_factory(spec.name, dict(spec.kwargs))
    return _create_timm(spec.name, dict(spec.kwargs))


def _create_timm(name: str, kwargs: dict[str, Any]) -> nn.Module:
    import timm

    _check_name(name)
    try:
        return timm.create_model(name, pretrained=False, **kwargs)
    except TypeError as e:
        raise PipesplitError(f"model {name} rejected --model-kwargs {kwargs}: {_first(e)}") from None
    except Exception as e:  # noqa: BLE001 - any failure to build from the user's kwargs is their input problem
        raise PipesplitError(f"model {name} cannot be built with kwargs {kwargs}: {type(e).__name__}: {_first(e)}") from None


def _timm_on_meta(name: str, kwargs: dict[str, Any]) -> nn.Module:
    """The timm model for its configuration only (input size), on meta: no storage, whatever its size."""
    with torch.device("meta"):
        return _create_timm(name, kwargs)


def _first(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:300] if lines else type(e).__name__


def _native_input_shape(model: nn.Module, kwargs: dict[str, Any]) -> tuple[tuple[int, ...], bool]:
    """(C, H, W) the model is configured for, and whether it only accepts that size."""
    from timm.data.config import resolve_model_data_config

    cfg = getattr(model, "pretrained_cfg", {}) or {}
    shape = tuple(int(d) for d in resolve_model_data_config(model)["input_size"])  # type: ignore[no-untyped-call]
    chans = int(kwargs.get("in_chans", shape[0]))
    img = getattr(getattr(model, "patch_embed", None), "img_size", None)
    if img is not None:
        h, w = (img, img) if isinstance(img, int) else tuple(img)
        return (chans, int(h), int(w)), bool(cfg.get("fixed_input_size", True))
    if "img_size" in kwargs:
        s = kwargs["img_size"]
        h, w = (s, s) if isinstance(s, int) else tuple(s)
        return (chans, int(h), int(w)), bool(cfg.get("fixed_input_size", False))
    return (chans, shape[1], shape[2]), bool(cfg.get("fixed_input_size", False))


def resolve_spec(
    name: str,
    *,
    kwargs: dict[str, Any] | None = None,
    batch_size: int | None = 32,
    image_size: int | None = None,
    dtype: str = "float32",
    checkpoint: str | None = None,
    seed: int = 0,
    source: str | None = None,
    seq_len: int | None = None,
) -> ModelSpec:
    """A ModelSpec whose input comes from the model itself: the image size a timm model takes
    (``image_size`` overrides it where allowed), an ``hf:`` model's token ids of ``seq_len``, a factory's
    example batch (``batch_size`` None: the example's own)."""
    kwargs = dict(kwargs or {})
    if source is None:
        source, name = ("hf", name[3:]) if name.startswith("hf:") else ("timm", name)
    if checkpoint is not None and not Path(checkpoint).is_file():
        raise PipesplitError(f"checkpoint {checkpoint} does not exist: pass a local state_dict file or leave it out")
    if source != "timm" and image_size is not None:
        raise PipesplitError(f"--image-size applies to timm image models, not {source} model {name}: "
                             + ("use --seq-len" if source == "hf" else "the factory's example batch sets the shape"))
    if source != "hf" and seq_len is not None:
        raise PipesplitError(f"--seq-len applies to hf: language models, not {source} model {name}: leave it out")
    common: dict[str, Any] = {"name": name, "source": source, "kwargs": kwargs, "dtype": dtype,
                              "checkpoint": checkpoint, "seed": seed}
    if source == "hf":
        from pipeline.models.hf import hf_input

        tokens = hf_input(name, kwargs, seq_len)
        spec = ModelSpec(batch_size=32 if batch_size is None else batch_size, input_shape=(tokens.seq_len,),
                         input_dtype="int64", input_high=tokens.vocab, **common)
        _check_hf(spec, tokens.vocab)
        return spec
    if source == "factory":
        from pipeline.models.factory import factory_input

        ex = factory_input(name, kwargs)
        return _with_inputs(ModelSpec(batch_size=ex.batch_size if batch_size is None else batch_size, **common),
                            ex.inputs)
    model = _timm_on_meta(name, kwargs)
    shape, fixed = _native_input_shape(model, kwargs)
    if image_size is not None:
        if image_size < 1:
            raise PipesplitError(f"--image-size must be a positive integer (got {image_size})")
        if fixed and image_size != shape[1]:
            raise PipesplitError(
                f"{name} takes a fixed input size of {shape[1]}px, so --image-size {image_size} does not apply: "
                f"pass --model-kwargs '{{\"img_size\": {image_size}}}' instead"
            )
        shape = (shape[0], image_size, image_size)
    return ModelSpec(batch_size=32 if batch_size is None else batch_size, input_shape=shape, **common)


def _check_hf(spec: ModelSpec, vocab: int) -> None:
    """The ``hf:`` model runs on token ids: tried with fake tensors (no storage: a model bigger than this
    host is checked too), and on a real build only where that fails, whose error is then the one said."""
    from pipeline.models.hf import check_runs

    try:
        check_runs(fake_model(build_meta_model(spec), torch.device("cpu")).module, spec.name, vocab, dict(spec.kwargs))
        return
    except Exception:  # noqa: BLE001 - a config error or a fake-tensor limit: the real build below tells which
        pass
    torch.manual_seed(spec.seed)
    check_runs(_create(spec), spec.name, vocab, dict(spec.kwargs))


def fit_input(spec: ModelSpec, *, given: bool) -> ModelSpec:
    """``spec`` with the input shape its model takes: derived from the model when the plan gave none (as the
    CLI derives it), checked against the model when it did (a fixed-size model names its own size)."""
    if spec.source == "hf":
        from pipeline.models.hf import hf_input

        tokens = hf_input(spec.name, dict(spec.kwargs), spec.input_shape[0] if given else None)
        return replace(spec, input_shape=(tokens.seq_len,), input_dtype="int64", input_high=tokens.vocab,
                       input_low=0)
    if spec.source == "factory":
        if given:
            return spec
        from pipeline.models.factory import factory_input

        return _with_inputs(spec, factory_input(spec.name, dict(spec.kwargs)).inputs)
    model = _timm_on_meta(spec.name, dict(spec.kwargs))
    native, fixed = _native_input_shape(model, dict(spec.kwargs))
    if not given:
        return replace(spec, input_shape=native)
    shape = spec.input_shape
    if len(shape) != len(native) or shape[0] != native[0] or (fixed and shape != native):
        need = list(native) if fixed else f"{native[0]} channels"
        raise PipesplitError(f"model.input_shape {list(shape)} does not fit {spec.name} with kwargs "
                             f"{dict(spec.kwargs)}: it takes {need}; fix input_shape or leave it out to derive it")
    return spec


def _with_inputs(spec: ModelSpec, inputs: tuple[TensorSpec, ...]) -> ModelSpec:
    """``spec`` fed ``inputs``: the first in the spec's own input fields, the rest as its extra inputs."""
    first = inputs[0]
    return replace(spec, input_shape=first.shape, input_dtype=first.dtype, input_low=first.low,
                   input_high=first.high, extra_inputs=inputs[1:])


def torch_dtype(spec: ModelSpec) -> torch.dtype:
    dtype: torch.dtype = getattr(torch, spec.dtype)
    return dtype


_RECENT: OrderedDict[str, MetaModel] = OrderedDict()
"""The last few models built on meta, by spec key: a command resolves, cuts and predicts the same model."""


def build_meta_model(spec: ModelSpec) -> MetaModel:
    """The model on the meta device, its build recorded so that any of its tensors can be made by name
    (``pipeline.models.meta``); a checkpoint is read key by key. A model whose code cannot run on meta is
    built for real once, with one line saying why (its process then holds it whole, and keeps no copy)."""
    if spec.key in _RECENT:
        _RECENT.move_to_end(spec.key)
        return _RECENT[spec.key]
    meta = _build_meta_model(spec)
    if not meta.built_whole:
        _RECENT[spec.key] = meta
        while len(_RECENT) > 2:
            _RECENT.popitem(last=False)
    return meta


def _build_meta_model(spec: ModelSpec) -> MetaModel:
    checkpoint = checkpoint_reader(spec.checkpoint, spec.label)
    try:
        meta = build_meta(lambda: _create(spec), spec.seed, torch_dtype(spec))
    except Exception as e:  # noqa: BLE001 - the eager build below fails with the user's own error, or works
        torch.manual_seed(spec.seed)
        eager = _create(spec).to(torch_dtype(spec)).eval()
        warnings.warn(f"{spec.label} cannot be built on the meta device ({_first(e)}); built whole on this "
                      "process instead: create its tensors without an explicit device and without reading "
                      "their values in __init__ to avoid this", stacklevel=2)
        meta = from_eager(eager, spec.seed)
    if checkpoint is not None:
        checkpoint.check(meta)
        meta.given = checkpoint.get
    return meta


def build_model(spec: ModelSpec) -> nn.Module:
    """The whole model in eval mode, real on the CPU, with the weights every stage of it gets by name
    (seeded by ``spec.seed``, or read from ``spec.checkpoint``)."""
    return whole_model(build_meta_model(spec), torch.device("cpu")).eval()
