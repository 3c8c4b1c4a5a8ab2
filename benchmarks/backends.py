"""Which backend traces which model family: one real 2-stage gloo trial per (family, backend, cut).

Tiny configs of GPT-2, Llama and BERT (transformers, random weights) and a tiny timm ViT for reference,
each cut in the middle of its layer stack and, where the model has one, right before its head. Every
trial checks the pipeline's output against the unsplit model; a failure prints the trial's own one-line
reason.

    python benchmarks/backends.py          # ~3 minutes on 2 cores
"""

from __future__ import annotations

import sys
from typing import Any

from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.models.build import resolve_spec
from pipeline.ranks.pool import StagePool

TINY: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "hf:gpt2": ({"n_layer": 4, "n_embd": 64, "n_head": 4, "vocab_size": 512, "n_positions": 128},
                ("transformer.h.2", "lm_head")),
    "hf:llama": ({"num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "vocab_size": 512}, ("model.layers.2", "lm_head")),
    "hf:bert": ({"num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                 "vocab_size": 512}, ("bert.encoder.layer.2", "cls")),
    "vit_tiny_patch16_224": ({"depth": 4, "embed_dim": 64, "num_heads": 2, "img_size": 32, "num_classes": 10},
                             ("blocks.2", "head")),
}


def main() -> int:
    print(f"{'model':22s} {'backend':7s} {'cut':22s} result")
    with StagePool(2, threads_per_stage=1, quiet=True) as pool:
        for name, (kwargs, cuts) in TINY.items():
            seq = {"seq_len": 32} if name.startswith("hf:") else {}
            spec = resolve_spec(name, kwargs=kwargs, batch_size=8, **seq)
            for backend in ("torch", "pippy"):
                for cut in cuts:
                    plan = SplitPlan(model=spec, split_points=(SplitPoint(cut),), chunks=4, backend=backend,
                                     threads_per_stage=1)
                    r = pool.run(plan, repeats=1, warmup=0, serial_all=False)
                    what = f"ok, max |diff| {r.max_abs_diff:.1e}" if r.ok else f"FAILED: {r.reason}"
                    print(f"{name:22s} {backend:7s} {cut:22s} {what}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
