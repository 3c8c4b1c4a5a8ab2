"""Segment timing in this process: one latency per candidate segment and size, bytes across each cut."""

import pytest
import torch

from pipeline.models.build import build_model
from pipeline.models.candidates import find_candidates
from pipeline.stage.probes import time_segments, timed_repeats


def test_every_segment_is_timed_at_every_size(tiny_spec):
    out = time_segments(tiny_spec, granularity="block", micro=[1, 4], repeats=1, warmup=0, device=torch.device("cpu"))
    cands = find_candidates(build_model(tiny_spec), tiny_spec)
    assert out.blocks == cands.blocks
    assert set(out.latency_s) == {1, 4} and all(len(v) == len(cands.blocks) for v in out.latency_s.values())
    assert all(t > 0 for t in out.latency_s[4])
    tokens = (32 // 8) ** 2 + 1
    assert out.cross_bytes[1] == tokens * 48 * 4  # between two ViT blocks: one sample's tokens
    assert len(out.param_bytes) == len(cands.blocks) and sum(out.param_bytes) > 0


def test_small_microbatches_are_timed_over_a_whole_batch():
    assert timed_repeats(3, 1, 32) == 32 and timed_repeats(3, 32, 32) == 3


def test_a_training_profile_times_each_segments_backward_halves_and_optimizer_step(tiny_spec):
    out = time_segments(tiny_spec, granularity="block", micro=[2], repeats=1, warmup=0, device=torch.device("cpu"),
                        train=True)
    n = len(out.blocks)
    assert set(out.backward_s) == {2} and len(out.backward_s[2]) == n and len(out.optimizer_s) == n
    whole, first, second = zip(*out.backward_s[2])
    assert all(t > 0 for t in whole) and all(t > 0 for t in second[1:-1])  # the blocks have weights
    assert first[0] == 0.0  # the first segment's input (the image) needs no gradient
    assert all(t > 0 for t in first[1:])  # every later segment returns its input's gradient upstream
    assert all(t >= 0 for t in out.optimizer_s) and max(out.optimizer_s) > 0
    assert len(out.saved_bytes) == n and all(b > 0 for b in out.saved_bytes[1:-1])
    tokens = (32 // 8) ** 2 + 1
    assert out.saved_bytes[1] > tokens * 48 * 4  # a block keeps more than its input for its backward


def test_a_training_profile_says_what_of_the_saved_bytes_is_each_segments_input_and_output(tiny_spec):
    out = time_segments(tiny_spec, granularity="block", micro=[2], repeats=1, warmup=0, device=torch.device("cpu"),
                        train=True)
    n = len(out.blocks)
    assert len(out.saved_input_bytes) == len(out.saved_output_bytes) == len(out.largest_param_bytes) == n
    assert all(0 <= i <= s and 0 <= o <= s for i, o, s in zip(out.saved_input_bytes, out.saved_output_bytes,
                                                               out.saved_bytes))
    tokens = (32 // 8) ** 2 + 1
    assert out.saved_input_bytes[1] == tokens * 48 * 4  # a block's first LayerNorm keeps its input
    assert all(0 <= big <= p for big, p in zip(out.largest_param_bytes, out.param_bytes))
    assert out.largest_param_bytes[1] == 48 * 4 * 48 * 4  # a block's largest: its MLP's 48 x 192 weight


@pytest.mark.parametrize("train", [False, True])
def test_a_mixed_precision_spec_is_timed_under_autocast_forward_only_too(monkeypatch, train):
    import dataclasses

    from pipeline.core.spec import ModelSpec
    from pipeline.stage import probes

    seen = []
    monkeypatch.setattr(probes, "_time_segments", lambda *a, **k: seen.append(torch.is_autocast_enabled("cpu")))
    spec = ModelSpec(name="m", batch_size=4, input_shape=(3, 8, 8))
    for s in (spec, dataclasses.replace(spec, mixed_precision="bf16")):
        probes.time_segments(s, granularity="block", micro=[1], repeats=1, warmup=0, device=torch.device("cpu"),
                             train=train)
    assert seen == [False, True]  # the stages-at-once profile (forward only) is in the same precision as the rest
