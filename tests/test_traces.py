"""The cached export: one per model and microbatch shape, every plan's Pipe cut from it like a fresh trace."""

import copy

import torch
from torch.distributed.pipelining import SplitPoint, pipeline

from pipeline.models.batch import example_input
from pipeline.models.build import build_model
from pipeline.models.candidates import find_candidates
from pipeline.models.traces import TraceCache


def test_a_pipe_from_the_cache_equals_a_fresh_trace(tiny_spec):
    model = build_model(tiny_spec)
    mb = example_input(tiny_spec, torch.device("cpu"))[0].chunk(2)[0]
    cache = TraceCache()
    with torch.no_grad():
        ref = model(mb)
    for cuts in (("blocks.2",), ("blocks.1.mlp", "head"), ("blocks.0.attn.qkv",)):
        spec = {c: "BEGINNING" for c in cuts}
        pipe = cache.pipe(tiny_spec.key, model, (mb,), spec)
        assert pipe is not None and pipe.num_stages == len(cuts) + 1
        fresh = pipeline(copy.deepcopy(model), mb_args=(mb,), split_spec={c: SplitPoint.BEGINNING for c in cuts})
        with torch.no_grad():
            got, want = pipe(mb), fresh(mb)
        got, want = (v[0] if isinstance(v, tuple) else v for v in (got, want))
        assert torch.equal(got, want) and torch.allclose(got, ref, atol=1e-5)
    assert cache.misses == 1 and cache.hits == 2  # one export served all three plans


def test_every_candidate_at_both_granularities_is_marked(tiny_spec):
    model = build_model(tiny_spec)
    mb = example_input(tiny_spec, torch.device("cpu"))
    cache = TraceCache()
    _, markers = cache._export(tiny_spec.key, model, mb)
    for gran in ("block", "layer"):
        assert set(find_candidates(model, tiny_spec, gran).cuts) <= markers


def test_a_cut_it_cannot_serve_is_left_to_a_fresh_trace(tiny_spec):
    model = build_model(tiny_spec)
    mb = example_input(tiny_spec, torch.device("cpu"))
    cache = TraceCache()
    assert cache.pipe(tiny_spec.key, model, mb, {"blocks.1": "END"}) is None
    assert cache.pipe(tiny_spec.key, model, mb, {"no.such.module": "BEGINNING"}) is None
    # a new microbatch shape is a new export; the oldest is dropped past the limit
    small = TraceCache(limit=1)
    small.pipe(tiny_spec.key, model, mb, {"blocks.1": "BEGINNING"})
    small.pipe(tiny_spec.key, model, (mb[0][:2],), {"blocks.1": "BEGINNING"})
    assert small.misses == 2 and len(small._exports) == 1


def test_a_rank_unflattens_only_its_own_stages_and_they_run_as_torchs(tiny_spec):
    from pipeline.models.traces import FLAT

    model = build_model(tiny_spec)
    mb = example_input(tiny_spec, torch.device("cpu"))[0].chunk(2)[0]
    cache = TraceCache()
    spec = {"blocks.1": "BEGINNING", "blocks.3": "BEGINNING"}
    whole = cache.pipe(tiny_spec.key, model, (mb,), spec)
    mine = cache.pipe(tiny_spec.key, model, (mb,), spec, held=(1,))
    assert whole is not None and mine is not None
    stages, theirs = list(mine.split_gm.children()), list(whole.split_gm.children())
    assert [getattr(m, FLAT, False) for m in stages] == [True, False, True]
    assert not any(getattr(m, FLAT, False) for m in whole.split_gm.children())
    # the held stage is torch's own module tree (same submodules, same names, same code); the flat ones compute
    # the same values; the whole split runs as before
    assert [n for n, _ in stages[1].named_modules()] == [n for n, _ in theirs[1].named_modules()]
    assert [n for n, _ in stages[1].named_parameters()] == [n for n, _ in theirs[1].named_parameters()]
    assert stages[1].code == theirs[1].code
    assert [n for n, _ in stages[0].named_parameters()] == [n for n, _ in theirs[0].named_parameters()]
    with torch.no_grad():
        got, want = mine(mb), whole(mb)
    got, want = (v[0] if isinstance(v, tuple) else v for v in (got, want))
    assert torch.equal(got, want)


def test_a_split_generates_code_only_for_what_runs_and_a_built_stage_has_all_its_code(tiny_spec):
    """torch's split compiles the whole model's code and each stage's twice; here only what a rank runs is, and
    ``compile_now`` leaves nothing for a stage's first (timed) run to generate."""
    from torch.fx._lazy_graph_module import _LazyGraphModule

    from pipeline.models.traces import compile_now

    def pending(module):
        return [m for m in module.modules() if isinstance(m, _LazyGraphModule) and m._needs_recompile()]

    model = build_model(tiny_spec)
    mb = example_input(tiny_spec, torch.device("cpu"))[0].chunk(2)[0]
    pipe = TraceCache().pipe(tiny_spec.key, model, (mb,), {"blocks.1": "BEGINNING", "blocks.3": "BEGINNING"},
                             held=(1,))
    assert pipe is not None
    stages = list(pipe.split_gm.children())
    assert pending(stages[0]) and pending(stages[2])  # never run on this rank: never compiled
    compile_now(stages[1])
    assert not pending(stages[1])
    with torch.no_grad():  # and the split still computes the model (the root and flat stages compile when called)
        got = pipe(mb)
        ref = model(mb)
    got = got[0] if isinstance(got, tuple) else got
    assert torch.allclose(got, ref, atol=1e-5)
