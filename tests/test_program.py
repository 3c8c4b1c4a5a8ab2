"""pipeline.models.program: which recorded ops a replay needs; a later op that overwrites a storage whole,
unread, makes the writes before it dead, and a partial one does not."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from pipeline.models.meta import build_meta, storage_key
from pipeline.models.program import _dense, overwritten_whole, replay_slice


@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), st.randoms(use_true_random=False))
def test_a_permuted_contiguous_layout_is_dense_and_a_strided_slice_is_not(shape, rnd):
    t = torch.empty(shape, device="meta")
    order = list(range(len(shape)))
    rnd.shuffle(order)
    permuted = t.permute(order)
    assert _dense(tuple(permuted.shape), tuple(permuted.stride()))
    big = [i for i, s in enumerate(shape) if s > 1]
    if big:
        sliced = torch.empty([s * 2 if i == big[0] else s for i, s in enumerate(shape)], device="meta")
        sliced = sliced[tuple(slice(None, None, 2) if i == big[0] else slice(None) for i in range(len(shape)))]
        assert not _dense(tuple(sliced.shape), tuple(sliced.stride()))


def test_a_partial_fill_keeps_what_came_before():
    """An embedding's ``weight[padding_idx].zero_()`` writes one row: the draw before it stays live."""
    meta = build_meta(lambda: torch.nn.Embedding(8, 4, padding_idx=0), 0, torch.float32)
    key = storage_key(meta.tensors["weight"])
    kept = replay_slice(meta._ops, {key})
    assert any(op.random for _, op in kept)
    fills = [op for _, op in kept if op.func._schema.name.endswith("fill_")]
    assert fills and all(overwritten_whole(op) is None for op in fills)
    real = meta.materialise(["weight"], torch.device("cpu"))["weight"]
    assert torch.all(real[0] == 0) and float(real[1:].abs().sum()) > 0
