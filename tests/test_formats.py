"""pipeline.peers.formats: a split in torchtitan's, Megatron-Core's and DeepSpeed's own formats, read back by
their own code (torchtitan's config and _split_module, megatron-core's layout parser, a real DeepSpeed
PipelineModule over two gloo ranks)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import tomllib

from pipeline.core.stack import find_stack
from pipeline.peers.formats import PlanView, deepspeed, export_to, megatron, torchtitan
from tests.conftest import free_port

LAYERS = 6  # torchtitan's llama3 debugmodel has 6 layers
NAMES = ("model.embed_tokens", *(f"model.layers.{i}" for i in range(LAYERS)), "model.norm", "lm_head")
ELEMENTS = (50, *([10] * LAYERS), 1, 50)


def view(cuts, *, ranks=None, per_rank=1, schedule="1F1B", chunks=4, shares=None) -> PlanView:
    total = sum(ELEMENTS)
    prefix = tuple(sum(ELEMENTS[:i]) / total for i in range(len(ELEMENTS) + 1))
    return PlanView(stack=find_stack(NAMES), names=NAMES, cuts=tuple(cuts), prefix=prefix,
                    cut_shares=tuple(shares or (prefix[c] for c in cuts)),
                    ranks=ranks or (len(cuts) + 1) // per_rank, per_rank=per_rank, schedule=schedule, chunks=chunks,
                    batch_size=8, mode="train", segment_elements=ELEMENTS)


def our_stages(cuts):
    """Our plan's stages as torchtitan's module names."""
    bounds = [0, *cuts, len(NAMES)]
    titan = {"model.embed_tokens": "tok_embeddings", "model.norm": "norm", "lm_head": "lm_head"}
    return [{titan.get(n, n.replace("model.", "")) for n in NAMES[a:b]} for a, b in zip(bounds, bounds[1:])]


def test_torchtitan_splits_its_own_llama_into_our_stages():
    import torch
    from torchtitan.config import ParallelismConfig
    from torchtitan.distributed.pipeline_parallel import _split_module
    from torchtitan.models.llama3 import model_registry

    cuts = (2, 5, 7)  # [embed, l0] [l1 l2 l3] [l4 l5] [norm head]
    out = torchtitan(view(cuts))
    assert out.unexpressible is None
    toml_part, py_part = out.text.split("# torchtitan >= 0.3")
    py_part = py_part.split("\n", 1)[1]
    cfg = tomllib.loads(toml_part)
    from_toml = ParallelismConfig(**cfg["parallelism"])
    scope: dict = {}
    exec(py_part, scope)  # the Python form, as a config_registry function would hold it
    assert scope["parallelism"] == from_toml and scope["training"].local_batch_size == 8
    assert (from_toml.pipeline_parallel_degree, from_toml.pipeline_parallel_schedule,
            from_toml.pipeline_parallel_microbatch_size) == (4, "1F1B", 2)
    with torch.device("meta"):
        whole = model_registry("debugmodel").model.build()
    for part, expected in zip(from_toml.module_fqns_per_model_part, our_stages(cuts)):
        stage = _split_module(whole, part)
        kept = {n for n, m in stage.named_children() if m is not None and n != "layers"}
        kept |= {f"layers.{k}" for k in stage.layers.keys()}
        assert kept == expected


def _layer_ids(layout_text: str, ranks: int, per_rank: int) -> dict[int, list[int]]:
    from megatron.core import parallel_state
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    layout = PipelineParallelLayerLayout(layout_text, ranks)
    layout.validate_layer_layout(num_layers=LAYERS, mtp_num_layers=None)
    parallel_state.set_virtual_pipeline_model_parallel_world_size(per_rank if per_rank > 1 else None)
    try:
        return {v * ranks + r: layout.get_layer_id_list(pp_rank=r, vp_stage=v) for r in range(ranks)
                for v in range(per_rank)}
    finally:
        parallel_state.set_virtual_pipeline_model_parallel_world_size(None)


@pytest.mark.parametrize("cuts, per_rank, schedule", [((2, 5, 7), 1, "1F1B"), ((1, 4), 1, "1F1B"),
                                                       ((2, 3, 5), 2, "Interleaved1F1B")])
def test_megatron_parses_our_layout_into_our_stages(cuts, per_rank, schedule):
    out = megatron(view(cuts, per_rank=per_rank, schedule=schedule))
    assert out.unexpressible is None
    text = out.text
    layout = text.split('--pipeline-model-parallel-layout "')[1].split('"')[0]
    ranks = int(text.split("--pipeline-model-parallel-size ")[1].split()[0])
    assert f"--num-layers {LAYERS}" in text
    ours = find_stack(NAMES).stage_layers(cuts)
    assert _layer_ids(layout, ranks, per_rank) == dict(enumerate(ours))


def test_a_cut_a_format_cannot_make_gets_one_line_and_the_nearest_plan():
    # a cut between the final norm and the head: torchtitan and Megatron keep those together, DeepSpeed does not
    out = megatron(view((4, 8), schedule="GPipe"))
    assert "cut 2 of the plan falls inside" in out.unexpressible and "no GPipe schedule" in out.unexpressible
    assert out.cuts == (4, 7) and "\"Et*3|t*3|L\"" in out.text
    assert torchtitan(view((4, 8))).cuts == (4, 7)
    assert deepspeed(view((4, 8))).unexpressible is None
    # a cut inside a layer (PiPPy's, say) goes to the nearest layer boundary by its share of the parameters
    total = sum(ELEMENTS)
    mid = torchtitan(view((-1,), shares=((50 + 10 * 2 + 4) / total,)))
    assert mid.cuts == (3,) and "cut 1 of the plan falls inside" in mid.unexpressible


def test_deepspeed_names_the_partition_method_that_already_gives_the_split():
    parts = [0, 3, 6, 9]
    out = deepspeed(view((3, 6)), parameters_parts=parts)
    assert 'partition_method="parameters")  # gives exactly these parts' in out.text and "PinnedPipe" not in out.text
    assert "PinnedPipe" in deepspeed(view((3, 6)), parameters_parts=[0, 4, 6, 9]).text
    with pytest.raises(ValueError, match="unknown: use one of torchtitan, megatron, deepspeed"):
        export_to("titan", view((3,)))


WORKER = textwrap.dedent("""
    import json, os, sys
    import torch
    import importlib
    import deepspeed
    # DeepSpeed's CPU backend JIT-compiles its shared-memory allreduce (~45 s with ninja on a fresh machine) at
    # init; building a PipelineModule's stages never calls it (deepspeed.comm.torch, not the name torch there)
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    layers = [torch.nn.Linear(2, 2) for _ in range({n})]
    scope = {{"layers": layers}}
    exec(open(sys.argv[1]).read(), scope)
    m = scope["model"]
    print("RESULT", json.dumps({{"parts": [int(p) for p in m.parts], "start": m._local_start, "stop": m._local_stop}}))
""")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_real_deepspeed_pipeline_module_builds_our_stages(tmp_path):
    cuts = (4,)  # [embed l0 l1 l2] [l3 l4 l5 norm head]
    code = deepspeed(view(cuts)).text
    (tmp_path / "split.py").write_text(code)
    (tmp_path / "worker.py").write_text(WORKER.format(n=len(NAMES)))
    procs, port = [], free_port()
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "DS_ACCELERATOR": "cpu"}
        procs.append(subprocess.Popen([sys.executable, str(tmp_path / "worker.py"), str(tmp_path / "split.py")],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=240)[0] for p in procs]
    results = []
    for p, text in zip(procs, outs):
        assert p.returncode == 0, text[-2000:]
        results.append(json.loads(next(line for line in text.splitlines() if line.startswith("RESULT"))[7:]))
    assert [r["parts"] for r in results] == [[0, 4, 9]] * 2
    assert [(r["start"], r["stop"]) for r in results] == [(0, 4), (4, 9)]


def test_a_plan_with_recomputation_carries_it_into_every_format():
    import dataclasses

    v = dataclasses.replace(view((3, 5, 7)), recompute=(2, 1, 0, 0))
    assert "RECOMPUTED = {'layers.0', 'layers.1', 'layers.2'}" in torchtitan(v).text
    assert "--recompute-num-layers 2" in megatron(v).text and "# not expressible: Megatron-Core" in megatron(v).text
    assert "activation_checkpoint_interval=1" in deepspeed(v).text
    assert "recompute" not in megatron(view((3, 5, 7))).text  # none: nothing written


def test_a_sharded_plan_writes_each_frameworks_data_parallel_degree():
    import dataclasses

    from torchtitan.config import ParallelismConfig

    v = dataclasses.replace(view((2, 5, 7)), dp_shard=2)
    toml_part = torchtitan(v).text.split("# torchtitan >= 0.3")[0]
    cfg = tomllib.loads(toml_part)
    par = ParallelismConfig(**cfg["parallelism"])  # torchtitan's own config takes it
    assert (par.data_parallel_shard_degree, par.pipeline_parallel_microbatch_size) == (2, 1)
    assert cfg["training"]["local_batch_size"] == 4
    m = megatron(v).text
    assert "--use-distributed-optimizer" in m and "--micro-batch-size 1" in m and "--global-batch-size 8" in m
    d = deepspeed(v)
    assert d.unexpressible is not None and "ZeRO stage 1 at most" in d.unexpressible


def test_mixed_precision_is_written_as_each_framework_spells_it():
    import dataclasses

    from torchtitan.config import TrainingConfig

    sharded = dataclasses.replace(view((2, 5, 7)), dp_shard=2)
    for mp, param in ((None, "float32"), ("bf16", "bfloat16")):  # torchtitan's own default is bfloat16: say which
        v = dataclasses.replace(sharded, mixed_precision=mp)
        cfg = tomllib.loads(torchtitan(v).text.split("# torchtitan >= 0.3")[0])
        training = TrainingConfig(**cfg["training"])  # torchtitan's own config takes it
        assert (training.mixed_precision_param, training.mixed_precision_reduce) == (param, "float32")
        assert f'mixed_precision_param="{param}"' in torchtitan(v).text
        assert ("--bf16" in megatron(v).text) == (mp is not None)
        assert ('"bf16": {"enabled": true}' in deepspeed(v).text) == (mp is not None)
    alone = torchtitan(dataclasses.replace(view((2, 5, 7)), mixed_precision="bf16"))
    assert alone.unexpressible is not None and "trains in float32" in alone.unexpressible
    assert "mixed_precision_param" not in torchtitan(view((2, 5, 7))).text
