"""pipeline.stage.segments: every segment timed one at a time, never the whole model real, same data as at once."""

import pytest
import torch

from pipeline.stage.probes import time_segments


@pytest.mark.parametrize("train", [False, True])
def test_streamed_segments_give_the_same_shape_of_profile_as_the_whole_model(tiny_spec, train):
    kw = {"granularity": "block", "micro": [8], "repeats": 1, "warmup": 0, "device": torch.device("cpu"),
          "train": train}
    whole = time_segments(tiny_spec, **kw)
    one = time_segments(tiny_spec, streamed=True, **kw)
    assert one.blocks == whole.blocks
    assert one.param_bytes == whole.param_bytes and one.cross_bytes == whole.cross_bytes
    assert one.largest_param_bytes == whole.largest_param_bytes
    assert set(one.latency_s) == {8} and all(t > 0 for v in one.latency_s.values() for t in v)
    if train:
        assert one.saved_bytes == whole.saved_bytes and len(one.optimizer_s) == len(whole.blocks)
        assert set(one.backward_s) == {8} and all(w > 0 for w, _, _ in one.backward_s[8])


@pytest.mark.multiprocess
def test_every_rank_of_a_pool_profiles_one_segment_at_a_time(pool2, tiny_spec):
    replies = pool2.profile(tiny_spec, "block", [2], 1, 0, streamed=True)
    assert len(replies) == 2 and replies[0].blocks == replies[1].blocks
    assert all(len(r.latency_s[2]) == len(r.blocks) for r in replies) and replies[0].param_bytes


def test_a_streamed_profile_holds_about_one_segment_never_the_whole_model():
    """A Llama of 6 blocks of 64 MiB: the profile's peak above what the process held as it started (one block,
    the values crossing the cuts, and the tracing's own allocations) stays far below the whole model's
    weights, and every segment is timed."""
    from pipeline.models.build import resolve_spec

    kw = {"num_hidden_layers": 6, "hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 4,
          "num_key_value_heads": 4, "vocab_size": 8000}
    spec = resolve_spec("hf:llama", kwargs=kw, batch_size=2, seq_len=8)
    args = {"granularity": "block", "micro": [2], "repeats": 1, "warmup": 0, "device": torch.device("cpu"),
            "streamed": True}
    time_segments(spec, **args)  # the first call imports and traces: what a worker has done before it profiles
    got = time_segments(spec, **args)
    whole = sum(got.param_bytes)
    assert whole > 420 * 2**20 and max(got.param_bytes) < whole / 6
    assert len(got.latency_s[2]) == len(got.blocks) and all(t > 0 for t in got.latency_s[2])
    assert 0 < got.peak_mem_bytes - got.base_mem_bytes < whole / 2, (got.peak_mem_bytes - got.base_mem_bytes, whole)
