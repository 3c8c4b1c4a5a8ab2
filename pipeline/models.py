"""Build timm models from a ModelSpec: random weights (no downloads), an optional local checkpoint."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.core.errors import PipesplitError
from pipeline.core.spec import ModelSpec


def _check_name(name: str) -> None:
    import timm

    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise PipesplitError(f"unknown timm model {name!r}{hint}: pass a name from timm.list_models()")


def _create(name: str, kwargs: dict[str, Any]) -> nn.Module:
    import timm

    _check_name(name)
    try:
        return timm.create_model(name, pretrained=False, **kwargs)
    except TypeError as e:
        raise PipesplitError(f"model {name} rejected --model-kwargs {kwargs}: {e}") from None
    except (AssertionError, ValueError, RuntimeError) as e:
        raise PipesplitError(f"model {name} cannot be built with kwargs {kwargs}: {e}") from None


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
    batch_size: int = 32,
    image_size: int | None = None,
    dtype: str = "float32",
    checkpoint: str | None = None,
    seed: int = 0,
) -> ModelSpec:
    """A ModelSpec whose input shape comes from the model itself (``image_size`` overrides it where allowed)."""
    kwargs = dict(kwargs or {})
    model = _create(name, kwargs)
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
    if checkpoint is not None and not Path(checkpoint).is_file():
        raise PipesplitError(f"checkpoint {checkpoint} does not exist: pass a local state_dict file or leave it out")
    return ModelSpec(
        name=name, kwargs=kwargs, batch_size=batch_size, input_shape=shape, dtype=dtype, checkpoint=checkpoint, seed=seed
    )


def torch_dtype(spec: ModelSpec) -> torch.dtype:
    dtype: torch.dtype = getattr(torch, spec.dtype)
    return dtype


def build_model(spec: ModelSpec) -> nn.Module:
    """The model in eval mode, weights seeded by ``spec.seed`` (or loaded from ``spec.checkpoint``)."""
    torch.manual_seed(spec.seed)
    model = _create(spec.name, dict(spec.kwargs))
    if spec.checkpoint:
        try:
            state = torch.load(spec.checkpoint, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unreadable file is the user's input problem
            raise PipesplitError(f"checkpoint {spec.checkpoint} could not be read ({type(e).__name__}: {e})") from None
        if isinstance(state, dict) and "state_dict" in state:
            state = state["state_dict"]
        try:
            model.load_state_dict(state)
        except RuntimeError as e:
            first = str(e).strip().splitlines()[0]
            raise PipesplitError(f"checkpoint {spec.checkpoint} does not fit {spec.name}: {first}") from None
    return model.to(torch_dtype(spec)).eval()


def example_input(spec: ModelSpec, device: str | torch.device = "cpu") -> torch.Tensor:
    """The whole batch every rank generates identically from the seed."""
    g = torch.Generator().manual_seed(spec.seed + 1)
    x = torch.randn((spec.batch_size, *spec.input_shape), generator=g)
    return x.to(device=device, dtype=torch_dtype(spec))
