"""costmodel.train: a training step priced by replaying a schedule's recorded action order (pure)."""

import dataclasses

import pytest

from costmodel.train import fsdp_seconds, in_flight, predict_train, recomputed_segments, train_stage_times
from tests.conftest import toy_profile
from tests.test_replay import ONE_F_ONE_B

GPIPE = [["0F0", "0F1", "0F2", "0F3", "0B0", "0B1", "0B2", "0B3"],
         ["1F0", "1F1", "1F2", "1F3", "1B0", "1B1", "1B2", "1B3"]]


def training_profile(per_sample=(1.0, 1.0, 1.0, 1.0), saved=100):
    prof = toy_profile(list(per_sample))
    segs = tuple(dataclasses.replace(s, backward_s={m: 2 * v for m, v in s.latency_s.items()},
                                     input_grad_s={m: v for m, v in s.latency_s.items()},
                                     weight_grad_s={m: v for m, v in s.latency_s.items()},
                                     optimizer_s=0.5, saved_bytes=saved, param_bytes=1000) for s in prof.segments)
    return dataclasses.replace(prof, segments=segs)


def test_stage_times_sum_their_segments_at_the_microbatch_size():
    times, opt = train_stage_times(training_profile(), [2], 4)  # microbatch 2
    assert [t.forward for t in times] == [4.0, 4.0] and [t.backward for t in times] == [8.0, 8.0]
    assert opt == [1.0, 1.0]
    with pytest.raises(ValueError, match="profile for training"):
        train_stage_times(toy_profile([1.0, 1.0]), [1], 2)


def test_1f1b_holds_fewer_microbatches_in_flight_than_gpipe():
    assert in_flight(GPIPE) == {0: 4, 1: 4}
    assert in_flight(ONE_F_ONE_B) == {0: 2, 1: 1}
    assert in_flight([["0F0", "0I0", "0W0", "0F1", "0I1", "0W1"]]) == {0: 1}  # W frees, not I


def test_a_step_is_the_replayed_schedule_then_each_ranks_optimizer_step():
    prof = training_profile()
    g = predict_train(prof, [2], 4, GPIPE)
    o = predict_train(prof, [2], 4, ONE_F_ONE_B)
    # stages of F=4, B=8 per microbatch: (M + S - 1) x (F + B) = 60, then a 1 s optimizer step on each rank
    assert g.makespan_s == pytest.approx(61) and o.makespan_s == pytest.approx(61)
    assert g.serial_s == pytest.approx(4 * 8 * 3 + 4 * 0.5)  # every segment's forward, backward, step at 8
    # memory: parameters, gradients, AdamW's two moments; activations 100 B/sample x 2 segments x 2 samples
    assert g.stage_mem_bytes == (2000 * 4 + 400 * 4, 2000 * 4 + 400 * 4)
    assert o.stage_mem_bytes == (2000 * 4 + 400 * 2, 2000 * 4 + 400 * 1)
    assert predict_train(prof, [2], 4, GPIPE, optimizer="sgd").stage_mem_bytes[0] == 2000 * 3 + 400 * 4


def test_dualpipev_frees_a_microbatch_on_a_whole_or_a_split_backward():
    assert in_flight([["0F0", "0F1", "0B0", "0I1", "0W1"]]) == {0: 2}
    assert in_flight([["0F0", "0B0", "0F1", "0I1", "0W1"]]) == {0: 1}


def test_forward_only_replays_the_orders_forwards_with_parameters_alone_in_memory():
    prof = toy_profile([1.0, 1.0, 1.0, 1.0])  # no backward times: a forward-only profile prices inference
    p = predict_train(prof, [2], 4, GPIPE, train=False)
    assert p.makespan_s == pytest.approx(5 * 4.0)  # (M + S - 1) x F at F = 4 (2 segments x microbatch 2)
    assert p.serial_s == pytest.approx(4 * 8.0)
    assert p.stage_mem_bytes == tuple(sum(s.param_bytes for s in prof.segments[a:b]) for a, b in ((0, 2), (2, 4)))
    assert p.rank_step_bytes == (0, 0)


def test_a_recomputed_layer_runs_its_forward_again_in_the_backward():
    prof = training_profile()  # 4 layers (blocks.0-3), forward 1 s/sample, backward 2 s/sample
    times, _ = train_stage_times(prof, [2], 4, recompute=[1, 2])  # microbatch 2
    assert times[0].backward == 8.0 + 2.0 and times[0].weight_grad == times[0].backward  # the first stage: W whole
    assert times[1].backward == 8.0 + 4.0 and times[1].input_grad == 4.0 + 4.0 and times[1].weight_grad == 4.0
    assert recomputed_segments(prof, [2], [1, 2]) == [[0], [2, 3]]
    assert recomputed_segments(prof, [2], None) == [[], []]
    slow = predict_train(prof, [2], 4, GPIPE, recompute=[2, 2])
    assert slow.makespan_s > predict_train(prof, [2], 4, GPIPE).makespan_s
    assert slow.rank_step_bytes[0] < predict_train(prof, [2], 4, GPIPE).rank_step_bytes[0]


def test_a_sharded_pipeline_is_one_replicas_share_plus_fsdps_collectives():
    prof = training_profile()  # batch 8; each segment 1000 parameter bytes, optimizer 0.5 s
    alone = predict_train(dataclasses.replace(prof, batch_size=4), [2], 4, GPIPE)  # one replica's 4 samples
    two = predict_train(prof, [2], 4, GPIPE, dp_shard=2)
    # the replica's step, its optimizer over half the parameters, and all-gather + reduce-scatter of 2000 B
    assert two.makespan_s == pytest.approx(alone.makespan_s - 1.0 + 0.5 + fsdp_seconds(prof, 2000, 2))
    assert fsdp_seconds(prof, 2000, 2) == pytest.approx(2 * prof.link.time(1000))
    mixed = dataclasses.replace(prof, model={**prof.model, "mixed_precision": "bf16"})
    assert fsdp_seconds(mixed, 2000, 2) == pytest.approx(prof.link.time(500) + prof.link.time(1000))  # gathered in bf16
    assert fsdp_seconds(prof, 2000, 1) == 0.0 and two.serial_s == predict_train(prof, [2], 4, GPIPE).serial_s
