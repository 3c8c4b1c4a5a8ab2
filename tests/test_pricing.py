"""search.plans.pricing: which model prices a plan, and what it predicts (pure)."""

import pytest

from search.plans.pricing import price, unpriced_reason
from search.plans.space import Layout
from tests.conftest import toy_profile
from tests.test_replay import ONE_F_ONE_B
from tests.test_train import GPIPE, training_profile

GPIPE_1 = Layout()
V2 = Layout(schedule="Interleaved1F1B", per_rank=2)


def test_forward_gpipe_is_simulated_and_holds_its_parameters():
    prof = toy_profile([1.0, 1.0, 1.0, 1.0])
    assert unpriced_reason(GPIPE_1, "infer", prof, None) is None  # needs no order
    p = price(prof, [2], 4, GPIPE_1, mode="infer", optimizer="adamw", order=None)
    assert p.model == "simulate" and p.speedup > 1 and p.rank_mem_bytes == (8, 8) and p.stage_s


def test_a_training_step_is_replayed_from_its_order():
    prof = training_profile()
    assert unpriced_reason(GPIPE_1, "train", prof, GPIPE) is None
    g = price(prof, [2], 4, GPIPE_1, mode="train", optimizer="adamw", order=GPIPE)
    o = price(prof, [2], 4, GPIPE_1, mode="train", optimizer="adamw", order=ONE_F_ONE_B)
    assert g.model == o.model == "replay" and g.makespan_s == pytest.approx(61)
    assert o.rank_mem_bytes[0] < g.rank_mem_bytes[0]  # 1F1B holds fewer microbatches


def test_what_cannot_be_priced_says_why():
    assert "no backward times" in unpriced_reason(GPIPE_1, "train", toy_profile([1.0, 1.0]), GPIPE)
    assert "action order" in unpriced_reason(V2, "infer", toy_profile([1.0, 1.0]), None)
    with pytest.raises(ValueError, match="action order"):
        price(toy_profile([1.0, 1.0]), [1], 2, V2, mode="infer", optimizer="adamw", order=None)
