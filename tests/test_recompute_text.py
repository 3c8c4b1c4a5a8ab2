"""pipeline.peers.recompute_text: a plan's recomputation as torchtitan, Megatron-Core and DeepSpeed users write it;
torchtitan's per-part policy run through torchtitan's own FullAC."""

import textwrap

import pytest
import tomllib
from torch import nn

from pipeline.core.stack import find_stack
from pipeline.peers.recompute_text import (
    deepspeed_recompute,
    megatron_recompute,
    recomputed_layers,
    torchtitan_recompute,
)

NAMES = ("model.embed_tokens", *(f"model.layers.{i}" for i in range(6)), "model.norm", "lm_head")
STACK = find_stack(NAMES)
CUTS = (3, 5, 7)  # [embed l0 l1] [l2 l3] [l4 l5] [norm head]: 2, 2, 2 and 0 layers


def test_the_layers_each_stage_recomputes_are_its_first():
    assert recomputed_layers(STACK, CUTS, (2, 1, 0, 0)) == [[0, 1], [2], [], []]


def test_one_mode_for_every_part_is_written_as_torchtitan_config():
    text = torchtitan_recompute(STACK, CUTS, (2, 2, 2, 0))  # every layer the stages hold: full
    toml = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    assert tomllib.loads(toml) == {"activation_checkpoint": {"mode": "full"}}
    assert "activation_checkpoint=FullAC.Config()" in text and "not expressible" not in text


def test_per_stage_counts_become_a_torchtitan_policy_that_wraps_exactly_those_layers():
    pytest.importorskip("torchtitan")
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    text = torchtitan_recompute(STACK, CUTS, (2, 1, 0, 0))
    assert text.startswith("# not expressible: torchtitan applies one activation_checkpoint mode")
    code = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    scope: dict = {}
    exec(textwrap.dedent(code), scope)
    policy = scope["PerStageAC"].Config().build()
    for part, want in (([0, 1, 2], {"0", "1", "2"}), ([3, 4, 5], set())):  # two model parts, as pipeline_llm makes
        model = nn.Module()
        model.layers = nn.ModuleDict({str(i): nn.Linear(2, 2) for i in part})
        policy.apply(model)
        wrapped = {k for k, m in model.layers.items() if isinstance(m, CheckpointWrapper)}
        assert wrapped == want & {"0", "1", "2"}


def test_megatron_writes_one_n_where_it_says_the_plan_and_the_least_n_that_covers_it_where_not():
    assert megatron_recompute(STACK, CUTS, (0, 0, 0, 0)) == []
    exact = megatron_recompute(STACK, CUTS, (1, 1, 1, 0))  # the last stage holds no layer: N = 1 is exact
    assert exact[1:] == ["--recompute-granularity full", "--recompute-method block", "--recompute-num-layers 1"]
    assert not exact[0].startswith("# not expressible")
    mixed = megatron_recompute(STACK, CUTS, (2, 1, 0, 0))
    assert mixed[0].startswith("# not expressible") and "nearest: N = 2" in mixed[0]
    assert mixed[-1] == "--recompute-num-layers 2"


def test_deepspeed_checkpoints_every_layer_or_none():
    assert "activation_checkpoint_interval=0" in deepspeed_recompute(STACK, CUTS, (0, 0, 0, 0))
    full = deepspeed_recompute(STACK, CUTS, (2, 2, 2, 0))
    assert "activation_checkpoint_interval=1" in full and "not expressible" not in full
    assert deepspeed_recompute(STACK, CUTS, (1, 0, 0, 0)).startswith("# not expressible: DeepSpeed")
