"""pipeline.stage.precision: bfloat16 compute over float32 weights, and a training step checked in it."""

import dataclasses

import pytest
import torch
from torch import nn

from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.core.spec import ModelSpec
from pipeline.models.build import resolve_spec
from pipeline.stage.precision import float_outputs, in_dtype, mixed, policy, run_stage

SPEC = ModelSpec(name="m", batch_size=8, input_shape=(3, 32, 32))
MIXED = dataclasses.replace(SPEC, mixed_precision="bf16")
LLAMA = {"num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
         "num_key_value_heads": 2, "vocab_size": 256}


def test_only_a_mixed_spec_gets_fsdp2s_policy():
    assert not mixed(SPEC) and policy(SPEC) is None
    p = policy(MIXED)
    assert (p.param_dtype, p.reduce_dtype) == (torch.bfloat16, torch.float32)


def test_a_batch_goes_low_but_its_token_ids_and_masks_do_not():
    ids, x, mask = torch.ones(2, 3, dtype=torch.int64), torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool)
    assert [t.dtype for t in in_dtype((ids, x, mask), torch.bfloat16)] == [torch.int64, torch.bfloat16, torch.bool]
    assert in_dtype((x,), None)[0] is x


@pytest.mark.parametrize("sharded", [False, True])
def test_a_reference_stage_computes_low_and_hands_back_float32(sharded):
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    out = run_stage(lin, "bf16", sharded, torch.device("cpu"), x)
    assert out.dtype == torch.float32
    full = lin(x)
    assert 0 < float((out - full).detach().abs().max()) < 0.05  # bfloat16's rounding, not float32's
    out.sum().backward()
    assert lin.weight.grad is not None and lin.weight.grad.dtype == torch.float32  # float32 weights' gradients
    assert run_stage(lin, None, sharded, torch.device("cpu"), x).equal(lin(x))


def test_a_stage_sends_float32_whatever_autocast_made():
    out = float_outputs(nn.Identity(), (), (torch.ones(2, dtype=torch.bfloat16), torch.ones(2, dtype=torch.int64)))
    assert [t.dtype for t in out] == [torch.float32, torch.int64]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_mixed_precision_step_under_autocast_is_checked_against_its_reference(pool2):
    spec = dataclasses.replace(resolve_spec("hf:llama", kwargs=LLAMA, batch_size=8, seq_len=16), mixed_precision="bf16")
    plan = SplitPlan(model=spec, split_points=(SplitPoint("model.layers.2"),), chunks=2, schedule="1F1B", mode="train")
    r = pool2.run(plan, repeats=1, warmup=0, serial_all=False)
    assert r.ok, r.reason
    c = r.check
    assert c is not None and c.precision == "bf16 autocast" and c.gradients == 39 and c.diff <= c.tolerance
    assert "in bf16 autocast (bfloat16's tolerance)" in c.describe()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_mixed_precision_step_on_sharded_stages_is_checked_against_its_reference(pool4):
    spec = resolve_spec("deit_tiny_patch16_224", kwargs={"depth": 4, "img_size": 32, "patch_size": 8, "embed_dim": 64,
                                                         "num_heads": 2}, batch_size=8)
    plan = SplitPlan(model=dataclasses.replace(spec, mixed_precision="bf16"), split_points=(SplitPoint("blocks.2"),),
                     chunks=2, schedule="GPipe", mode="train", dp_shard=2, recompute="full")
    r = pool4.run(plan, repeats=1, warmup=0, serial_all=False)
    assert r.ok, r.reason  # float images cast to bfloat16 at the first stage, bfloat16 sent between stages
    c = r.check
    assert c is not None and c.precision == "bf16 FSDP2 policy" and c.diff <= c.tolerance
    assert c.loss_diff is not None and c.loss_diff <= c.loss_tolerance
