"""An encoder-decoder (T5) as pipesplit runs it: token ids for the encoder and for the decoder, two inputs.

``python -m pipeline.run --model-factory tests/factories/t5.py:build --stages 2 --policy uniform --chunks 2``
"""

import torch
from torch import nn
from transformers import T5Config, T5ForConditionalGeneration


class T5Logits(T5ForConditionalGeneration):
    """T5 whose forward takes (encoder ids, decoder ids) and returns the logits, one tensor."""

    def forward(self, input_ids, decoder_input_ids):  # type: ignore[override]
        return super().forward(input_ids=input_ids, decoder_input_ids=decoder_input_ids, return_dict=False)[0]


def build(num_layers: int = 2, d_model: int = 64, vocab_size: int = 256, seq_len: int = 16, batch: int = 4):
    config = T5Config(num_layers=num_layers, d_model=d_model, d_ff=2 * d_model, num_heads=4, d_kv=d_model // 4,
                      vocab_size=vocab_size, use_cache=False)
    model: nn.Module = T5Logits(config).eval()
    ids = torch.randint(0, vocab_size, (batch, seq_len))
    return model, (ids, ids.clone())
