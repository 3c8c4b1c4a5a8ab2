"""pipeline.peers.rules: each framework's rule on our segments is the plan that framework's own function returns."""

import pytest

from pipeline.core.policies import PolicyInputs
from pipeline.core.stack import find_stack
from pipeline.peers.registry import DEFAULT_RULES, POLICIES, policy
from pipeline.peers.rules import PeerMissing, deepspeed_cuts, framework_module, megatron_cuts, torchtitan_cuts

CASES = [(4, 2), (8, 4), (6, 3), (16, 4), (7, 3), (12, 2)]


def llama(layers: int, vocab_weight: int = 50) -> PolicyInputs:
    names = ("model.embed_tokens", *(f"model.layers.{i}" for i in range(layers)), "model.norm", "lm_head")
    return PolicyInputs(unit_elements=(), segment_elements=(vocab_weight, *([10] * layers), 1, vocab_weight),
                        segment_names=names)


def titan_names(inputs: PolicyInputs, cuts: list[int]) -> list[list[str]]:
    stack = find_stack(inputs.segment_names)
    per = stack.stage_layers(cuts)
    return [(["tok_embeddings"] if s == 0 else []) + [f"layers.{i}" for i in layers]
            + (["norm", "lm_head"] if s == len(per) - 1 else []) for s, layers in enumerate(per)]


@pytest.mark.parametrize("layers, stages", CASES)
@pytest.mark.parametrize("weights", [(1, 1), (2, 2)])
def test_torchtitan_is_its_generate_llm_fqn_per_model_part(layers, stages, weights):
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part

    inputs = llama(layers)
    try:
        theirs = _generate_llm_fqn_per_model_part(stages, layers, *weights)
    except ValueError:
        with pytest.raises(ValueError):
            torchtitan_cuts(inputs, stages, *weights)
        return
    if any(not part for part in theirs):
        with pytest.raises(ValueError, match="without a module"):
            torchtitan_cuts(inputs, stages, *weights)
        return
    assert titan_names(inputs, torchtitan_cuts(inputs, stages, *weights)) == theirs


@pytest.mark.parametrize("layers, stages", CASES)
@pytest.mark.parametrize("account", [False, True])
def test_megatron_is_its_get_num_layers_to_build(layers, stages, account):
    import torch
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig

    inputs = llama(layers)
    try:
        cfg = TransformerConfig(num_layers=layers, hidden_size=64, num_attention_heads=4,
                                pipeline_model_parallel_size=stages, pipeline_dtype=torch.float32,
                                account_for_embedding_in_pipeline_split=account, account_for_loss_in_pipeline_split=account)
        theirs = [get_num_layers_to_build(cfg, pp_rank=r) for r in range(stages)]
    except (AssertionError, ValueError):
        with pytest.raises(ValueError, match="Megatron-Core refuses"):
            megatron_cuts(inputs, stages, account)
        return
    ours = find_stack(inputs.segment_names).stage_layers(megatron_cuts(inputs, stages, account))
    assert [len(s) for s in ours] == theirs
    assert ours[0] == list(range(theirs[0]))  # the embedding's stage starts the stack


@pytest.mark.parametrize("layers, stages", CASES)
@pytest.mark.parametrize("method", ["parameters", "uniform"])
def test_deepspeed_is_its_partition(layers, stages, method):
    from deepspeed.runtime.utils import partition_balanced, partition_uniform

    inputs = llama(layers)
    items = [float(w) for w in inputs.segment_elements]  # each segment of a Llama is one PipelineModule layer
    parts = partition_uniform(len(items), stages) if method == "uniform" else partition_balanced(items, stages)
    assert deepspeed_cuts(inputs, stages, method) == [int(p) for p in parts[1:-1]]


def test_deepspeed_weighs_a_stacked_layer_as_one_layer():
    names = ("embed", "layers.0.attn", "layers.0.mlp", "layers.1.attn", "layers.1.mlp", "head")
    inputs = PolicyInputs(unit_elements=(), segment_elements=(1, 2, 3, 4, 5, 6), segment_names=names)
    assert deepspeed_cuts(inputs, 3, "uniform") in ([1, 3], [3, 5])  # cuts only between whole layers


def test_the_registry_names_every_framework_rule_and_their_defaults():
    assert DEFAULT_RULES == ("torchtitan", "megatron", "deepspeed-parameters")
    for name in ("torchtitan", "torchtitan-w2", "megatron", "megatron-account", "deepspeed-parameters",
                 "deepspeed-uniform"):
        assert POLICIES[name].framework in ("torchtitan", "megatron", "deepspeed") and not POLICIES[name].on_units
    assert policy("equal-size").name == "pippy-equal-size"
    with pytest.raises(ValueError, match="unknown: use one of .*torchtitan"):
        policy("titan")


def test_a_framework_not_installed_says_how_to_install_it():
    with pytest.raises(PeerMissing, match=r"pip install 'pipesplit\[peers\]' \(or torchtitan\)"):
        framework_module("torchtitan", "torchtitan_is_not_here")


def test_a_model_without_one_stack_is_refused_by_every_rule():
    inputs = PolicyInputs(unit_elements=(), segment_elements=(1, 2, 3, 4), segment_names=("stem", "a.0", "b.0", "fc"))
    for name in ("torchtitan", "megatron", "deepspeed-parameters"):
        with pytest.raises(ValueError, match="2 stacks"):
            policy(name).cuts(inputs, 2)


@pytest.mark.parametrize("name", ["hf:gpt2", "hf:qwen2", "hf:mistral"])
def test_each_language_model_family_gets_each_frameworks_plan(name):
    from pipeline.models.build import build_meta_model, resolve_spec
    from pipeline.models.candidates import find_candidates
    from tests.hf_families import tiny_kwargs

    kwargs = tiny_kwargs(name[3:]) | {k: 4 for k in ("num_hidden_layers", "n_layer") if k in tiny_kwargs(name[3:])}
    spec = resolve_spec(name, kwargs=kwargs, batch_size=2, seq_len=8)
    cands = find_candidates(build_meta_model(spec), spec)
    stack = find_stack(cands.blocks)
    assert stack.layers == 4 and stack.pre >= 1 and cands.blocks[-1] == "lm_head"
    for rule in DEFAULT_RULES:
        (point,) = cands.policy_points(rule, 2)
        assert point.fqn == f"{stack.prefix}.2" and point.kind == "BEGINNING"  # 4 layers, 2 stages: each rule halves
