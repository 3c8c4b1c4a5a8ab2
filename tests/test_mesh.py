"""pipeline.stage.mesh: the pipeline inside sharded data parallel (FSDP2 on a (pp, dp_shard) mesh), on 4 gloo ranks."""

import dataclasses

import pytest
import torch

from pipeline.core.budget import predict_memory
from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.core.spec import ModelSpec
from pipeline.models.build import resolve_spec
from pipeline.stage.mesh import replica_rows

LLAMA = {"num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
         "num_key_value_heads": 2, "vocab_size": 256}
SPEC = ModelSpec(name="m", batch_size=8, input_shape=(3, 32, 32))


def test_each_replica_takes_its_contiguous_share_of_the_batch():
    x = (torch.arange(8).reshape(8, 1), torch.arange(8))
    assert [replica_rows(x, d, 2)[1].tolist() for d in (0, 1)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert replica_rows(torch.arange(8), 3, 4).tolist() == [6, 7]


def test_a_sharded_plan_counts_every_process_and_round_trips():
    p = SplitPlan(model=SPEC, split_points=(SplitPoint("b.2"),), chunks=2, mode="train", dp_shard=2)
    assert (p.ranks, p.world) == (2, 4) and "dp_shard 2" in p.describe()
    assert SplitPlan.from_dict(p.to_dict()) == p and "dp_shard" not in dataclasses.replace(p, dp_shard=1).to_dict()


def test_a_sharded_rank_is_predicted_to_hold_a_share_of_its_stage_and_the_stage_gathered():
    plan = SplitPlan(model=SPEC, split_points=(SplitPoint("b.2"),), chunks=2, mode="train", schedule="GPipe")
    kw = dict(weights=[1000, 1000], leaf_out_sum=[10, 10], leaf_out_max=[0, 0], runtime=0, budget=10**9)
    one = predict_memory(plan, **kw).ranks[0]
    two = predict_memory(dataclasses.replace(plan, dp_shard=2), **kw).ranks[0]
    assert (one.weights, one.train_state) == (1000, 3000)  # gradients and AdamW's two moments
    assert (two.weights, two.train_state) == (500 + 1000, 500 * 3 + 1000)
    assert two.activations * 2 == one.activations  # each replica's microbatches are half as big


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_two_stages_by_two_replicas_train_a_language_model_to_the_reference(pool4, pool2, schedule):
    spec = resolve_spec("hf:llama", kwargs=LLAMA, batch_size=8, seq_len=16)
    plan = SplitPlan(model=spec, split_points=(SplitPoint("model.layers.2"),), chunks=2, schedule=schedule,
                     mode="train", dp_shard=2)
    r = pool4.run(plan, repeats=1, warmup=0, serial_all=False)
    assert r.ok, r.reason
    c = r.check
    assert c is not None and c.compared == "loss and gradients" and c.diff <= c.tolerance
    assert c.loss_diff is not None and c.loss_diff <= c.loss_tolerance and c.gradients == 39
    assert len(r.peak_mem_bytes) == 4 and all(p > 0 for p in r.peak_mem_bytes)  # every rank of the mesh
    if schedule != "GPipe":
        return  # the shards' bytes do not depend on the schedule: compared once
    whole = pool2.run(dataclasses.replace(plan, dp_shard=1), repeats=1, warmup=0, serial=False, serial_all=False)
    assert whole.ok, whole.reason
    for s in (0, 1):  # ranks 2s and 2s+1 hold stage s, each a shard of its weights
        a, b = r.stage_bytes[2 * s], r.stage_bytes[2 * s + 1]
        assert a < whole.stage_bytes[s] and b < whole.stage_bytes[s]
        assert whole.stage_bytes[s] <= a + b <= whole.stage_bytes[s] + 4096  # (+ the small unsharded buffers)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_recomputation_on_sharded_stages_in_the_other_mesh_order_trains_to_the_reference(pool4):
    spec = resolve_spec("hf:llama", kwargs=LLAMA, batch_size=8, seq_len=16)
    plan = SplitPlan(model=spec, split_points=(SplitPoint("model.layers.2"),), chunks=2, schedule="1F1B",
                     mode="train", dp_shard=2, recompute="1,0", mesh_order="dp_shard,pp")
    r = pool4.run(plan, repeats=1, warmup=0, serial_all=False)
    assert r.ok, r.reason
    assert r.check is not None and r.check.diff <= r.check.tolerance
    # dp_shard outermost: processes 0, 1 are replica 0's pipeline, 2, 3 replica 1's; 0 and 2 shard stage 0
    assert r.stage_bytes[0] == r.stage_bytes[2] and r.stage_bytes[1] == r.stage_bytes[3]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_plain_fsdp_on_four_ranks_trains_to_the_reference(pool4):
    spec = resolve_spec("hf:llama", kwargs=LLAMA, batch_size=8, seq_len=16)
    plan = SplitPlan(model=spec, split_points=(), chunks=1, mode="train", dp_shard=4)
    assert plan.describe().startswith("plain FSDP: the whole model on each of 4 replicas")
    r = pool4.run(plan, repeats=1, warmup=0, serial_all=False)
    assert r.ok, r.reason
    assert r.check is not None and r.check.diff <= r.check.tolerance and r.check.gradients == 39


def test_plain_fsdp_takes_no_split_points(capsys):
    from pipeline.run import main

    args = ["--model", "hf:llama", "--model-kwargs", '{"num_hidden_layers": 2, "hidden_size": 32, '
            '"intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 128}',
            "--seq-len", "8", "--batch-size", "8", "--stages", "1", "--dp-shard", "2", "--mode", "train",
            "--split-points", "model.layers.1"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--stages 1 with --dp-shard is plain FSDP" in err and err.count("\n") == 1
