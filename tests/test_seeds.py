"""The seeds of a study: PiPPy's plan first, the cost model's best two, every block policy, merged."""

import pytest

from costmodel.types import Link, Profile, Segment
from pipeline.models.build import build_model
from pipeline.models.candidates import find_candidates
from search.plans.seeds import frameworks_line, seeds


@pytest.fixture(scope="module")
def cands(tiny_spec):
    return find_candidates(build_model(tiny_spec), tiny_spec)


def profile_for(cands, batch):
    segs = tuple(Segment(fqn=b, flops=100 * (i + 1), param_bytes=4 * n, out_bytes=64 if i < len(cands.blocks) - 1 else 0,
                         latency_s={m: 0.01 * (i + 1) * m for m in (1, 2, 4, 8)})
                 for i, (b, n) in enumerate(zip(cands.blocks, cands.segment_params())))
    return Profile(model={"name": "tiny"}, device="cpu", threads=1, granularity="block", batch_size=batch,
                   segments=segs, link=Link(latency_s=1e-5, bandwidth_Bps=1e9))


def test_every_policy_seeds_the_study_once(tiny_spec, cands):
    out = seeds(profile_for(cands, tiny_spec.batch_size), cands, 2, [1, 2, 4, 8])
    assert out[0].source == "pippy-equal-size" and out[0].points and out[0].cuts is None
    names = {n for s in out for n in s.source.split("+")}
    assert names == {"pippy-equal-size", "costmodel-optimum", "costmodel-next", "uniform", "params-balanced",
                     "time-balanced", "flops-balanced", "torchtitan", "torchtitan-w2", "megatron", "megatron-account",
                     "deepspeed-parameters", "deepspeed-uniform"}
    keys = [(s.cuts, s.points, s.chunks) for s in out]
    assert len(keys) == len(set(keys))  # the same plan twice is merged, its sources joined by '+'
    for s in out:
        assert s.chunks in (1, 2, 4, 8)
        if s.cuts is not None:
            assert len(s.cuts) == 1 and 0 < s.cuts[0] < len(cands.blocks)


def test_a_search_seeds_pippy_the_cost_model_and_each_frameworks_default(tiny_spec, cands):
    out = seeds(profile_for(cands, tiny_spec.batch_size), cands, 2, [1, 2, 4, 8], policies=False)
    names = {n for s in out for n in s.source.split("+")}
    assert names == {"pippy-equal-size", "costmodel-optimum", "costmodel-next", "torchtitan", "megatron",
                     "deepspeed-parameters"}
    # the ViT's blocks are one stack: torchtitan keeps its patch embedding and its norm + head as one layer each
    titan = next(s for s in out if "torchtitan" in s.source.split("+"))
    assert titan.cuts == (3,) and cands.blocks[3] == "blocks.2"


def test_a_framework_rule_that_does_not_apply_is_one_line():

    missing = {"torchtitan": "its layers form 2 stacks (a, b), not one", "megatron": "its layers form 2 stacks (a, b), not one",
               "deepspeed-parameters": "pip install 'pipesplit[peers]'"}
    line = frameworks_line(missing)
    assert line == ("not measured: torchtitan, megatron (its layers form 2 stacks (a, b), not one); "
                    "deepspeed-parameters (pip install 'pipesplit[peers]')") and "\n" not in line
