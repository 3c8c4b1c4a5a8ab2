"""search.plans.fitting: what --device-memory means for a study, settled before a profile or a trial (model on meta)."""

import json

import pytest

from pipeline.core.errors import PipesplitError
from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.models.build import build_meta_model, resolve_spec
from pipeline.models.candidates import find_candidates
from pipeline.ranks.probe import rank_runtime
from search.plans.fitting import device_fit

BIG_LLAMA = {"num_hidden_layers": 6, "hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 4,
             "num_key_value_heads": 4, "vocab_size": 8000}
MiB = 2**20


@pytest.fixture(scope="module")
def big():
    spec = resolve_spec("hf:llama", kwargs=BIG_LLAMA, batch_size=4, seq_len=16)
    meta = build_meta_model(spec)
    runtime = rank_runtime(json.dumps(spec.to_dict(), sort_keys=True), "block", "cpu")
    return spec, meta, find_candidates(meta, spec, "block"), runtime


def _fit(big, budget, **kw):
    spec, meta, cands, _ = big
    args = {"ranks": 2, "chunks": 4, "schedule": "GPipe", "per_rank": 1, "mode": "infer", "optimizer": "adamw",
            "device": "cpu", "backend": "torch", **kw}
    return device_fit(budget, meta, cands, spec, **args)


def test_without_a_budget_speedup_is_the_figure_and_nothing_is_predicted(big):
    fit = _fit(big, None)
    assert (fit.metric, fit.serial_fits, fit.memory_of, fit.lean_cuts) == ("speedup", True, None, ())
    assert _fit(big, None, objective="throughput").metric == "throughput"


def test_a_model_over_the_budget_is_ranked_by_throughput_from_its_leanest_plan_that_fits(big):
    spec, _, cands, runtime = big
    budget = runtime + 340 * MiB
    fit = _fit(big, budget)
    assert fit.metric == "throughput" and not fit.serial_fits and fit.whole_bytes > budget
    assert fit.lean_cuts == (4,)  # three blocks and the embedding | three and the head
    lean = SplitPlan(model=spec, split_points=(SplitPoint(cands.blocks[4]),), chunks=4)
    pred = fit.memory_of(lean)
    assert pred.ranks[0].runtime == 0 and max(r.total for r in pred.ranks) + runtime <= budget
    assert all(r.serial == 0 for r in pred.ranks)  # no serial model on rank 0 without speedup
    with pytest.raises(PipesplitError, match="--objective speedup needs a serial baseline"):
        _fit(big, budget, objective="speedup")
    with pytest.raises(PipesplitError, match="torchpippy 0.2 traces the whole model on every rank"):
        _fit(big, budget, backend="pippy")


def test_where_the_whole_model_fits_rank_0_also_holds_the_serial_model(big):
    spec, _, cands, runtime = big
    fit = _fit(big, runtime + 2048 * MiB)
    assert fit.metric == "speedup" and fit.serial_fits
    pred = fit.memory_of(SplitPlan(model=spec, split_points=(SplitPoint(cands.blocks[4]),), chunks=4))
    assert pred.ranks[0].serial == fit.whole_bytes - fit.first_runtime and pred.ranks[1].serial == 0
    assert fit.lean_cuts == (1,)  # rank 0 keeps least beside the serial model: the embedding alone


def test_no_plan_that_fits_is_one_line_naming_the_stages_or_dtype_that_would(big):
    _, _, _, runtime = big
    with pytest.raises(PipesplitError) as e:
        _fit(big, runtime + 150 * MiB)
    text = str(e.value)
    assert "no split of hf:llama into 2 stages fits --device-memory" in text and "nothing was run" in text
    assert "Use --stages 4 (its leanest plan's largest rank" in text and "or --dtype bfloat16" in text
    assert "\n" not in text


def test_a_training_study_predicts_from_its_profiles_saved_bytes_once_it_has_them(big):
    spec, _, cands, runtime = big
    assert not _fit(big, None).use_profile([1] * len(cands.blocks), cands)  # no budget: nothing predicted
    fit = _fit(big, runtime + 2048 * MiB, mode="train")
    plan = SplitPlan(model=spec, split_points=(SplitPoint(cands.blocks[4]),), chunks=4, mode="train")
    before = fit.memory_of(plan).ranks[0].activations
    assert not fit.use_profile([0] * len(cands.blocks), cands)  # a forward-only profile measured none
    assert fit.use_profile([10 * MiB] * len(cands.blocks), cands)
    after = fit.memory_of(plan).ranks[0].activations
    assert after != before and after == 4 * 10 * MiB * 4  # four segments x 10 MiB a sample x 4 microbatches of 1
