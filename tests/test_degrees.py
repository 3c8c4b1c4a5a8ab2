"""search.degrees: which pipeline degree on N processes, and whether a pipeline beats plain FSDP."""

import json

import pytest

from pipeline.core.errors import PipesplitError
from search.degrees import DegreeRow, degrees, verdict


def test_the_degrees_are_the_divisors_the_model_can_be_cut_into():
    assert degrees(4, 12) == [2, 4] and degrees(12, 4) == [2, 3, 4] and degrees(8, 12, pinned=2) == [2]
    with pytest.raises(PipesplitError, match="--ranks 6 is not --stages 4 x a number of replicas"):
        degrees(6, 12, pinned=4)
    with pytest.raises(PipesplitError, match="--ranks 7 has no pipeline degree from 2 to 4"):
        degrees(7, 4)
    with pytest.raises(PipesplitError, match="--ranks 1 leaves nothing to choose"):
        degrees(1, 4)


def _row(label, *tput):
    return DegreeRow(label=label, plan={}, throughput=tuple(tput))


def test_the_verdict_says_how_the_best_pipeline_compares_with_plain_fsdp():
    assert verdict([_row("2 stages x dp_shard 2", 13.0), _row("plain FSDP", 10.0)]) == \
        "the best is 2 stages x dp_shard 2, 1.30x plain FSDP (13 vs 10 samples/s)"
    assert verdict([_row("2 stages x dp_shard 2", 8.0), _row("4 stages x dp_shard 1", 9.0), _row("plain FSDP", 10.0)]) \
        .startswith("plain FSDP is faster here: do not pipeline (10 samples/s, 1.11x the best pipeline, 4 stages")


LLAMA = {"num_hidden_layers": 4, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2,
         "num_key_value_heads": 2, "vocab_size": 128}


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_four_rank_search_of_a_pinned_degree_is_compared_with_plain_fsdp(tmp_path, pool4, capsys):
    from pipeline.ranks.launch import lend_pool
    from search.optimize import main

    args = ["--model", "hf:llama", "--model-kwargs", json.dumps(LLAMA), "--seq-len", "16", "--batch-size", "8",
            "--ranks", "4", "--stages", "2", "--mode", "train", "--schedule", "1F1B", "--trials", "1", "--chunks", "2",
            "--confirm-top", "0", "--repeats", "1", "--min-trial-seconds", "0", "--confirm-rounds", "1",
            "--storage", f"sqlite:///{tmp_path / 's.db'}", "--results-dir", str(tmp_path), "--no-progress",
            "--no-artifacts"]
    with lend_pool(pool4):  # the study and the side-by-side round both run on the session's 4 ranks
        assert main(args) == 0
    out = capsys.readouterr().out
    doc = json.loads(next(tmp_path.glob("*/degrees.json")).read_text())
    labels = [r["label"] for r in doc["rows"]]
    assert labels == ["2 stages x dp_shard 2", "plain FSDP"]  # --stages 2 pins the degree (degrees() covers the rest)
    assert all(r["throughput"] for r in doc["rows"]) and all(len(r["peak_mib"]) == 4 for r in doc["rows"])
    assert all(len(r["predicted_mib"]) == r["plan"]["stages"] for r in doc["rows"])  # per pipeline rank
    assert doc["verdict"].startswith(("the best is ", "plain FSDP is faster here")) and doc["verdict"] in out
