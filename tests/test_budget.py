"""pipeline.core.budget: sizes, each rank's predicted peak, and the one line that refuses a plan over the budget."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.budget import (
    BlockBytes,
    format_size,
    in_flight,
    leanest_cuts,
    parse_size,
    predict_memory,
    recomputed,
)
from pipeline.core.errors import PipesplitError
from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.core.spec import ModelSpec

SPEC = ModelSpec(name="m", batch_size=8, input_shape=(3, 32, 32))


def _plan(stages: int = 4, **kw) -> SplitPlan:
    return SplitPlan(model=kw.pop("model", SPEC), split_points=tuple(SplitPoint(f"b.{i}") for i in range(1, stages)),
                     chunks=kw.pop("chunks", 4), **kw)


def test_sizes_as_people_write_them():
    assert parse_size("1.5GiB") == 3 * 2**29 and parse_size("512MiB") == 2**29 and parse_size("2GB") == 2 * 10**9
    assert parse_size("4096") == 4096
    for bad in ("", "-1GiB", "0", "lots", "3 parsecs"):
        with pytest.raises(PipesplitError, match=r"--device-memory .* is not a positive size: write it like 4GiB"):
            parse_size(bad)


@given(st.integers(min_value=2**20, max_value=2**45))
def test_a_formatted_size_reads_back_within_its_rounding(n):
    back = parse_size(format_size(n).replace(" ", ""))
    assert abs(back - n) <= max(2**20 // 2 + 1, n * 0.006)


@given(st.integers(1, 8), st.sampled_from(["GPipe", "1F1B"]), st.sampled_from(["infer", "train"]),
       st.sampled_from([1, 2, 4, 8]))
def test_microbatches_in_flight(ranks, schedule, mode, chunks):
    if schedule == "1F1B" and chunks < ranks:
        chunks = 8  # torch's 1F1B needs a microbatch per stage
    plan = _plan(ranks, schedule=schedule, mode=mode, chunks=chunks)
    for r in range(ranks):
        k = in_flight(plan, r)
        assert 1 <= k <= chunks
        if mode == "train" and schedule == "1F1B":
            assert k == min(chunks, ranks - r)


@given(st.lists(st.integers(0, 2**32), min_size=4, max_size=4), st.integers(0, 2**30))
def test_each_rank_holds_its_own_weights_and_training_adds_gradients_and_two_moments(weights, runtime):
    sums, maxes = [10, 20, 30, 40], [1, 2, 3, 4]
    infer = predict_memory(_plan(), weights=weights, leaf_out_sum=sums, leaf_out_max=maxes, runtime=runtime,
                           budget=2**40)
    train = predict_memory(_plan(mode="train", optimizer="adamw"), weights=weights, leaf_out_sum=sums,
                           leaf_out_max=maxes, runtime=runtime, budget=2**40)
    sgd = predict_memory(_plan(mode="train", optimizer="sgd"), weights=weights, leaf_out_sum=sums, leaf_out_max=maxes,
                         runtime=runtime, budget=2**40)
    assert [r.weights for r in infer.ranks] == weights and all(r.train_state == 0 for r in infer.ranks)
    assert [r.train_state for r in train.ranks] == [3 * w for w in weights]
    assert [r.train_state for r in sgd.ranks] == [2 * w for w in weights]
    assert all(r.runtime == runtime for r in infer.ranks)
    assert infer.whole >= sum(weights) + runtime


def test_two_stages_per_rank_count_on_their_rank():
    plan = _plan(4, stages_per_rank=2, schedule="Interleaved1F1B")
    p = predict_memory(plan, weights=[1, 2, 4, 8], leaf_out_sum=[0] * 4, leaf_out_max=[0] * 4, runtime=0, budget=99)
    assert [r.weights for r in p.ranks] == [1 + 4, 2 + 8]


def test_a_plan_over_the_budget_is_one_line_naming_the_rank_and_the_fix():
    p = predict_memory(_plan(), weights=[2**30, 2**28, 2**28, 2**28], leaf_out_sum=[0] * 4, leaf_out_max=[0] * 4,
                       runtime=2**28, budget=2**30)
    assert p.worst.rank == 0 and not p.serial_fits
    with pytest.raises(PipesplitError) as e:
        p.check(_plan())
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("rank 0 needs about 1.25 GiB (weights 1.00 GiB, activations 0 MiB, runtime 256 MiB), "
                          "over --device-memory 1.00 GiB: nothing was built; use more stages (--stages), "
                          "--dtype bfloat16")
    fits = predict_memory(_plan(), weights=[2**20] * 4, leaf_out_sum=[0] * 4, leaf_out_max=[0] * 4, runtime=0,
                          budget=2**30)
    fits.check(_plan())
    assert fits.serial_fits


@given(st.lists(st.tuples(st.integers(0, 2**30), st.integers(0, 2**20), st.integers(0, 2**18)), min_size=2, max_size=7),
       st.integers(1, 4), st.sampled_from([1, 2, 8]), st.sampled_from(["infer", "train"]), st.integers(0, 2**30))
def test_the_leanest_cuts_are_the_least_largest_rank_of_every_plan(segs, ranks, chunks, mode, serial):
    """The dynamic programme against every plan of the same shape, each predicted by ``predict_memory``."""
    import itertools

    ranks = min(ranks, len(segs))
    weights = [w for w, _, _ in segs]
    out_sum = [s + m for _, s, m in segs]  # a segment's largest leaf output is part of its sum
    out_max = [m for _, _, m in segs]
    plan = _plan(ranks, chunks=chunks, mode=mode, schedule="1F1B" if mode == "train" and chunks >= ranks else "GPipe")
    cuts, worst = leanest_cuts(plan, weights=weights, leaf_out_sum=out_sum, leaf_out_max=out_max, runtime=5,
                               serial=serial)
    best = None
    for cand in itertools.combinations(range(1, len(segs)), ranks - 1):
        bounds = [0, *cand, len(segs)]
        stage_w = [sum(weights[a:b]) for a, b in zip(bounds, bounds[1:])]
        stage_s = [sum(out_sum[a:b]) for a, b in zip(bounds, bounds[1:])]
        stage_m = [max(out_max[a:b]) for a, b in zip(bounds, bounds[1:])]
        got = predict_memory(plan, weights=stage_w, leaf_out_sum=stage_s, leaf_out_max=stage_m, runtime=5, budget=1,
                             serial=False).ranks
        top = max(r.total + (serial if r.rank == 0 else 0) for r in got)
        best = top if best is None else min(best, top)
    assert worst.total == best and len(cuts) == ranks - 1 and list(cuts) == sorted(set(cuts))


def test_rank_0_holds_the_serial_model_beside_its_stage_where_the_baseline_is_timed():
    plan = _plan(2)
    kw = {"weights": [100, 300], "leaf_out_sum": [1, 1], "leaf_out_max": [1, 1], "runtime": 10, "budget": 10**6}
    alone = predict_memory(plan, **kw)
    timed = predict_memory(plan, serial=True, **kw)
    assert timed.ranks[0].serial == alone.whole - 10 and timed.ranks[1] == alone.ranks[1]
    assert timed.ranks[0].total == alone.ranks[0].total + alone.whole - 10
    assert "the serial baseline's whole model" in timed.ranks[0].describe()


def test_a_recomputed_block_keeps_its_input_and_holds_its_activations_once_more():
    blocks = (BlockBytes(saved=100, kept=10), BlockBytes(saved=60, kept=10))
    assert recomputed(200, blocks, 0) == (200, 0)
    assert recomputed(200, blocks, 1) == (110, 100) and recomputed(200, blocks, 2) == (60, 100)


def test_recomputation_lowers_the_training_prediction_where_the_counts_say():
    plan = _plan(2, mode="train", schedule="1F1B", chunks=4)  # rank 0 holds 2 microbatches in flight, rank 1 one
    blocks = [(BlockBytes(saved=1000, kept=100),), (BlockBytes(saved=1000, kept=100),)]
    kw = dict(weights=[0, 0], leaf_out_sum=[1000, 1000], leaf_out_max=[0, 0], runtime=0, budget=10**9, blocks=blocks)
    none = predict_memory(plan, **kw)
    first = predict_memory(plan, **kw, counts=[1, 0])
    micro = 2
    assert none.ranks[0].activations == 1000 * micro * 2
    assert first.ranks[0].activations == 100 * micro * 2 + 1000 * micro  # inputs in flight, one block again
    assert first.ranks[1].activations == none.ranks[1].activations
    assert predict_memory(_plan(2, chunks=4), **kw, counts=[1, 1]).ranks[0].activations == \
        predict_memory(_plan(2, chunks=4), **kw).ranks[0].activations  # inference recomputes nothing


def test_the_refusal_names_the_callers_fixes_first_and_no_schedule_the_plan_already_has():
    plan = _plan(2, mode="train", schedule="1F1B", chunks=4)
    over = predict_memory(plan, weights=[10, 10], leaf_out_sum=[10**6, 10**6], leaf_out_max=[0, 0], runtime=0,
                          budget=1000)
    with pytest.raises(PipesplitError) as e:
        over.check(plan, ["--recompute 1,0 (the fewest blocks recomputed per stage that fit)"])
    text = str(e.value)
    assert "use --recompute 1,0" in text and "--schedule 1F1B" not in text and "more --chunks" in text


def test_mixed_precision_counts_the_bfloat16_copy_of_the_weights_beside_the_float32_ones():
    import dataclasses

    mixed = dataclasses.replace(SPEC, mixed_precision="bf16")
    kw = dict(weights=[1000, 1000], leaf_out_sum=[0, 0], leaf_out_max=[0, 0], runtime=0, budget=10**9)
    one = predict_memory(_plan(2, mode="train", model=mixed, chunks=2), **kw)
    assert [(r.weights, r.train_state) for r in one.ranks] == [(1500, 3000)] * 2  # autocast's cast of each weight
    two = predict_memory(_plan(2, mode="train", model=mixed, chunks=2, dp_shard=2), **kw)
    assert two.ranks[0].weights == 500 + 500  # a float32 shard, the stage gathered in bfloat16
    assert one.whole == predict_memory(_plan(2, mode="train", chunks=2), **kw).whole + 1000
