"""pipeline.models.footprint: each stage's weights and activations from the model on meta, and a plan's prediction."""

from __future__ import annotations

import torch
from conftest import TINY_VIT

from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.models.build import build_meta_model, build_model, resolve_spec
from pipeline.models.candidates import find_candidates
from pipeline.models.footprint import default_budget, leaf_outputs, predict_plan, stage_bytes

GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 128, "n_positions": 32}


def test_stage_weights_add_up_to_the_model_and_match_what_a_rank_makes():
    spec = resolve_spec("deit_tiny_patch16_224", kwargs=TINY_VIT, batch_size=8)
    meta = build_meta_model(spec)
    cands = find_candidates(meta, spec)
    plan = SplitPlan(model=spec, split_points=(SplitPoint("blocks.1"), SplitPoint("blocks.3")), chunks=2)
    sb = stage_bytes(meta, spec, cands, plan)
    whole = build_model(spec)
    assert sum(sb.weights) == sum(t.numel() * t.element_size() for t in [*whole.parameters(), *whole.buffers()])
    block = sum(p.numel() * 4 for p in whole.blocks[1].parameters())
    assert sb.weights[1] == 2 * block  # blocks 1 and 2
    assert all(s > 0 for s in sb.leaf_out_sum) and all(0 < m <= s for m, s in zip(sb.leaf_out_max, sb.leaf_out_sum))
    assert all(p.is_meta for p in meta.module.parameters())  # nothing was made real


def test_a_tied_weight_cut_apart_counts_on_both_stages():
    spec = resolve_spec("hf:gpt2", kwargs=GPT2, batch_size=2, seq_len=8)
    meta = build_meta_model(spec)
    cands = find_candidates(meta, spec)
    plan = SplitPlan(model=spec, split_points=(SplitPoint("transformer.h.1"),), chunks=1)
    sb = stage_bytes(meta, spec, cands, plan)
    distinct = sum(p.numel() * 4 for p in build_model(spec).parameters())
    assert sum(sb.weights) - 128 * 32 * 4 >= distinct  # the embedding on the first, the head on the last


def test_leaf_outputs_are_per_sample_and_the_budget_defaults_to_the_host_share(monkeypatch):
    spec = resolve_spec("deit_tiny_patch16_224", kwargs=TINY_VIT, batch_size=8)
    meta = build_meta_model(spec)
    cands = find_candidates(meta, spec)
    leaves = leaf_outputs(meta, spec, cands)
    head = cands.events.index("B:head")
    assert leaves[head] == 10 * 4  # 10 logits of one sample
    import pipeline.models.footprint as footprint

    monkeypatch.setattr(footprint, "_available_bytes", lambda: 12 * 2**30 + 1)  # the host's memory moves meanwhile
    assert (default_budget("cpu", 1), default_budget("cpu", 2), default_budget("cpu", 0)) == (
        12 * 2**30 + 1, 6 * 2**30, 12 * 2**30 + 1)
    plan = SplitPlan(model=spec, split_points=(SplitPoint("blocks.2"),), chunks=2, mode="train")
    p = predict_plan(plan, meta, cands, budget=2**30, runtime=0)
    assert [r.train_state for r in p.ranks] == [3 * r.weights for r in p.ranks] and p.budget == 2**30
    assert torch.float32 == next(meta.module.parameters()).dtype


def test_a_training_profiles_measured_saved_bytes_replace_the_leaves_as_each_stages_activations():
    from pipeline.models.footprint import measured_saved

    spec = resolve_spec("deit_tiny_patch16_224", kwargs=TINY_VIT, batch_size=8)
    meta = build_meta_model(spec)
    cands = find_candidates(meta, spec)
    plan = SplitPlan(model=spec, split_points=(SplitPoint("blocks.1"), SplitPoint("blocks.3")), chunks=2, mode="train")
    leaves = leaf_outputs(meta, spec, cands)
    before = stage_bytes(meta, spec, cands, plan, leaves)
    saved = [1000 * (k + 1) for k in range(len(cands.blocks))]  # what autograd kept per segment, per sample
    measured_saved(leaves, cands, saved)
    after = stage_bytes(meta, spec, cands, plan, leaves)
    per = dict(zip(cands.blocks, saved))
    starts = [cands.blocks.index(c) for c in ("blocks.1", "blocks.3")]
    bounds = list(zip([0, *starts], [*starts, len(cands.blocks)]))
    assert after.leaf_out_sum == tuple(sum(saved[a:b]) for a, b in bounds)
    assert after.leaf_out_max == before.leaf_out_max and after.weights == before.weights  # the output's size stays
    assert [b.saved for b in after.blocks[1]] == [per["blocks.1"], per["blocks.2"]]  # what recomputing each frees
