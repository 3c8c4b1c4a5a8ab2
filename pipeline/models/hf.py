"""Hugging Face ``transformers`` models built from their config (random weights, nothing downloaded).

``hf:<model type>`` names a config (``AutoConfig.for_model``); the model is the type's masked-LM class
where it has one (encoders such as BERT), else its causal-LM class (GPT-2, Llama), else its base model.
Its forward takes token ids only and returns the first output (the logits) as one tensor: the class is
subclassed with that forward, so module names stay the model's own (``transformer.h.0``, ``model.layers.0``)
and the tracers see one tensor in, one tensor out.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pipeline.core.errors import PipesplitError, one_line

__all__ = ["HFInput", "build_hf", "check_runs", "hf_input"]

PIP = "pip install -e '.[hf]'"
_LOGITS: dict[type, type] = {}


@dataclass(frozen=True, kw_only=True)
class HFInput:
    """What an ``hf:`` model is fed: token ids in [0, vocab) of ``seq_len`` per sample."""

    seq_len: int
    vocab: int


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise PipesplitError(f"hf: models need the transformers package, which is not installed: {PIP}") from None
    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    return transformers


def _config(model_type: str, kwargs: dict[str, Any]) -> Any:
    """The type's config with ``kwargs`` applied; an unknown type or key is one line with close matches."""
    tf = _transformers()
    from transformers import CONFIG_MAPPING

    types = sorted(CONFIG_MAPPING.keys())
    if model_type not in CONFIG_MAPPING:
        close = difflib.get_close_matches(model_type, types, n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join('hf:' + c for c in close)}?)" if close else ""
        raise PipesplitError(f"unknown transformers model type {model_type!r}{hint}: use hf:<type> with a type from "
                             "transformers.CONFIG_MAPPING, e.g. hf:gpt2, hf:llama, hf:bert")
    cls = CONFIG_MAPPING[model_type]
    try:
        known = set(cls().to_dict()) | set(getattr(cls, "attribute_map", {})) | {"attn_implementation"}
    except Exception:  # noqa: BLE001 - a config whose own defaults fail its checks: the call below says what
        known = set(kwargs)
    unknown = [k for k in kwargs if k not in known]
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(known), n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise PipesplitError(f"--model-kwargs key {unknown[0]!r} is not a setting of {cls.__name__}{hint}: "
                             "use the config's own names, e.g. n_layer for gpt2, num_hidden_layers for llama")
    try:
        return tf.AutoConfig.for_model(model_type, **kwargs)
    except Exception as e:  # noqa: BLE001 - the config refused the user's values
        raise PipesplitError(f"hf:{model_type} rejected --model-kwargs {kwargs}: {one_line(e)}") from None


def _model_class(model_type: str) -> Any:
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return AutoModelForMaskedLM
    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return AutoModelForCausalLM
    return AutoModel


def _returns_logits(cls: type) -> type:
    """``cls`` with a forward that takes token ids and returns its first output (built once per class)."""
    base: Any = cls
    if cls not in _LOGITS:
        def forward(self: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
            out = base.forward(self, input_ids=input_ids, return_dict=False)
            return out[0] if isinstance(out, (tuple, list)) else out  # type: ignore[no-any-return]

        _LOGITS[cls] = type(cls.__name__, (cls,), {"forward": forward, "__module__": cls.__module__,
                                                   "__qualname__": cls.__qualname__})
    return _LOGITS[cls]


def build_hf(model_type: str, kwargs: dict[str, Any]) -> nn.Module:
    """A freshly initialised ``hf:`` model (the caller seeds torch first), in eval mode."""
    config = _config(model_type, dict(kwargs))
    if hasattr(config, "use_cache"):
        config.use_cache = False
    try:
        model: nn.Module = _model_class(model_type).from_config(config)
    except Exception as e:  # noqa: BLE001 - a config that builds no model is the user's input problem
        raise PipesplitError(f"hf:{model_type} cannot be built with --model-kwargs {kwargs}: {one_line(e)}") from None
    model.__class__ = _returns_logits(type(model))
    if next(model.parameters(), torch.empty(0)).is_meta and hasattr(model, "initialize_weights"):
        pretrained: Any = model
        pretrained.initialize_weights()  # transformers skips its own init on meta; the recorded build needs it
        pretrained.tie_weights()
    return model.eval()


def hf_input(model_type: str, kwargs: dict[str, Any], seq_len: int | None) -> HFInput:
    """The token input of an ``hf:`` model: ``seq_len`` (default 128, at most the model's maximum) and its vocabulary."""
    config = _config(model_type, dict(kwargs))
    limit = getattr(config, "max_position_embeddings", None)
    n = 128 if seq_len is None else seq_len
    if n < 1:
        raise PipesplitError(f"--seq-len must be a positive integer (got {n})")
    if isinstance(limit, int) and 0 < limit < n:  # -1 (XLNet): no limit
        raise PipesplitError(f"--seq-len {n} is over hf:{model_type}'s maximum of {limit} positions: use at most "
                             f"{limit}, or raise it in --model-kwargs (max_position_embeddings)")
    vocab = getattr(config, "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 1:
        raise PipesplitError(f"hf:{model_type} has no vocab_size in its config, so its token input is unknown: "
                             "use --model-factory with an example batch instead")
    return HFInput(seq_len=n, vocab=vocab)


NEEDS_INPUTS = ("decoder_input", "required positional argument", "pixel_values", "input_features", "language",
                "inputs_embeds", "image")
"""Words of an error that says the model wants inputs besides token ids (rather than failing on its config)."""


def check_runs(model: nn.Module, model_type: str, vocab: int, kwargs: dict[str, Any] | None = None) -> None:
    """Run the model once on two tokens: a type that needs more than token ids, or whose config cannot run,
    is one line at the start that says which of the two it is."""
    ids = torch.randint(0, vocab, (1, 2))
    try:
        with torch.no_grad():
            out = model(ids)
    except Exception as e:  # noqa: BLE001 - classified below: the user's kwargs or the model's inputs
        config = getattr(model, "config", None)
        if getattr(config, "is_encoder_decoder", False):
            raise PipesplitError(f"hf:{model_type} is an encoder-decoder: its decoder needs token ids of its own, "
                                 "so it does not run on token ids alone; use a --model-factory that returns (model, "
                                 "(ids, decoder_ids)), as tests/factories/t5.py does (README: encoder-decoder "
                                 "models)") from None
        if any(w in str(e) for w in NEEDS_INPUTS):
            raise PipesplitError(f"hf:{model_type} does not run on token ids alone ({one_line(e)}): wrap it in a "
                                 "--model-factory that builds its inputs") from None
        raise PipesplitError(f"hf:{model_type} failed on its own config with --model-kwargs {kwargs or {}} "
                             f"({one_line(e)}): the model cannot run these settings; check them against "
                             f"{type(config).__name__} (e.g. num_key_value_heads must divide num_attention_heads)") from None
    if not isinstance(out, torch.Tensor):
        raise PipesplitError(f"hf:{model_type}'s first output is a {type(out).__name__}, not a tensor: wrap it in a "
                             "--model-factory whose model returns one tensor")
