"""Tiny configs for every transformers causal-LM family, from each family's own config class.

Each family's defaults are kept except its sizes, which are shrunk by the config's own key names (or the
``attribute_map`` aliases it declares), so a family's model is built as its authors wrote it, only small.
"""

from __future__ import annotations

from typing import Any

TINY = {
    # depth
    "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "n_layers": 2, "decoder_layers": 2, "encoder_layers": 2,
    "num_decoder_layers": 2,
    # width
    "hidden_size": 64, "n_embd": 64, "d_model": 64, "dim": 64, "embed_dim": 64, "n_embed": 64, "word_embed_proj_dim": 64,
    "intermediate_size": 128, "n_inner": 128, "ffn_dim": 128, "decoder_ffn_dim": 128, "encoder_ffn_dim": 128,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "d_ff": 128, "ffn_hidden_size": 128,
    # heads
    "num_attention_heads": 4, "n_head": 4, "num_heads": 4, "n_heads": 4, "decoder_attention_heads": 4,
    "encoder_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "kv_channels": 16,
    # experts
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "moe_num_experts": 4,
    # tokens
    "rotary_dim": 8, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16, "kv_lora_rank": 16,
    "q_lora_rank": 16,
    # tokens
    "vocab_size": 256, "max_position_embeddings": 64, "n_positions": 64, "n_ctx": 64, "pad_token_id": 0,
    "bos_token_id": 1, "eos_token_id": 2,
}


def causal_lm_types() -> list[str]:
    """Every model type transformers maps to a causal-LM class, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def tiny_kwargs(model_type: str) -> dict[str, Any]:
    """The TINY sizes this family's config knows (its own keys and aliases), the rest its defaults."""
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    known = set(cls().to_dict()) | set(getattr(cls, "attribute_map", {}))
    return {k: v for k, v in TINY.items() if k in known}


MAX_PARAMS = 20_000_000
"""A tiny config whose model still holds more parameters than this is not built (a size key it lacks)."""


def meta_params(model_type: str, kwargs: dict[str, Any]) -> int:
    """The parameter count of the family's model at ``kwargs``, built on the meta device (no memory)."""
    import torch

    from pipeline.models.hf import _config, _model_class

    config = _config(model_type, dict(kwargs))
    with torch.device("meta"):
        model = _model_class(model_type).from_config(config)
    return sum(p.numel() for p in model.parameters())


def sweep(model_types: list[str]) -> dict[str, tuple[str, str]]:
    """Each family's (verdict, detail): ``ok`` with its block candidates, ``looped`` (its layers run more than
    once per forward, so there is no stack to cut), or why it does not build or run."""
    import re
    from collections import Counter

    from pipeline.core.errors import PipesplitError
    from pipeline.models.batch import example_input, rows
    from pipeline.models.build import build_meta_model, resolve_spec
    from pipeline.models.candidates import find_candidates
    from pipeline.models.traces import call_events
    from pipeline.models.weights import with_forward

    out: dict[str, tuple[str, str]] = {}
    for mt in model_types:
        try:
            kwargs = tiny_kwargs(mt)
            n = meta_params(mt, kwargs)
        except Exception as e:  # noqa: BLE001 - the family's own code refused its tiny config
            out[mt] = ("does not build", f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
            continue
        if n > MAX_PARAMS:
            out[mt] = ("does not shrink", f"{n / 1e6:.0f}M parameters with the common size keys (nested configs)")
            continue
        try:
            spec = resolve_spec("hf:" + mt, kwargs=kwargs, batch_size=2, seq_len=8)
        except PipesplitError as e:
            out[mt] = ("refused", str(e).split(" --model-kwargs ")[0] + " ..." if "--model-kwargs" in str(e)
                       else str(e)[:160])
            continue
        meta = build_meta_model(spec)  # as every command does: on meta, its forward on fake tensors
        raw, ran = with_forward(meta, rows(example_input(spec), 1), lambda m, xs: (call_events(m, xs), m))
        blocks = find_candidates(ran, spec, calls=raw).blocks
        stacked = [b for b in blocks if re.search(r"\.\d+$", b)]
        calls = Counter(name for kind, name in raw if kind == "B")
        if not stacked and any(c > 1 and re.search(r"layers\.\d+$", name) for name, c in calls.items()):
            out[mt] = ("looped", f"its layers run more than once per forward: cut only at {', '.join(blocks)}")
        else:
            out[mt] = ("ok", f"{len(stacked)} stacked blocks of {len(blocks)}: {blocks[0]} .. {blocks[-1]}")
    return out


def main() -> None:
    """Print the sweep's table: each family, its verdict and why."""
    for mt, (verdict, detail) in sorted(sweep(causal_lm_types()).items()):
        print(f"{mt:28s} {verdict:16s} {detail}")
