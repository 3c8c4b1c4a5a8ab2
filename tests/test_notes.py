"""The dashboard notes, as text (a real search saves them: test_optimize reads them back)."""

from search.study.notes import study_note, trial_note


def test_a_trial_note_shows_the_plan_by_name_and_predicted_beside_measured():
    attrs = {"source": "sampler", "split_points": ["blocks.3"], "chunks": 8, "speedup": 1.71, "repeats": 3,
             "speedup_spread": [1.65, 1.8], "predicted_speedup": 1.9, "calibrated_speedup": 1.75,
             "peak_mem_bytes": [200 * 2**20, 100 * 2**20]}
    names = ["patch_embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "blocks.4", "head"]
    note = trial_note(attrs, names, number=7, state="measured", timeline_url="/artifacts/1/7/abc")
    assert note.startswith("## Trial 7: measured (sampler)")
    assert "- stage 1: patch_embed..blocks.2" in note and "- stage 2: blocks.3..head" in note
    assert "| measured (median of 3 repeats) | 1.71x |" in note and "| predicted by the cost model | 1.90x |" in note
    assert "rank 0: peak 200 MiB, rank 1: peak 100 MiB" in note and "![measured timeline](/artifacts/1/7/abc)" in note


def test_a_measured_speedup_above_the_machines_ceiling_is_flagged_in_the_note():
    attrs = {"source": "sampler", "split_points": ["blocks.3"], "chunks": 8, "value": 2.06, "repeats": 2,
             "predicted_ceiling": 2.0}
    note = trial_note(attrs, ["a", "blocks.3"], number=1, state="measured")
    assert "| measured (median of 2 repeats) | 2.06x (above the 2.00x ceiling: noise) |" in note
    assert "above the" not in trial_note({**attrs, "value": 1.9}, ["a", "blocks.3"], number=1, state="measured")


def test_a_throughput_trial_note_shows_samples_per_second_and_memory_against_the_budget():
    attrs = {"source": "sampler", "split_points": ["blocks.3"], "chunks": 8, "value": 12.5, "repeats": 2,
             "throughput_spread": [12.0, 13.0], "predicted_value": 11.0, "peak_mem_bytes": [900 * 2**20, 950 * 2**20],
             "predicted_rank_bytes": [880 * 2**20, 940 * 2**20]}
    note = trial_note(attrs, ["a", "blocks.3"], number=2, state="measured", metric="throughput", budget=2**30)
    assert "| measured (median of 2 repeats) | 12.5 samples/s |" in note and "12 samples/s .. 13 samples/s" in note
    assert "**Memory per rank** (of 1.00 GiB each): rank 0: peak 900 MiB, predicted 880 MiB" in note


def test_a_raced_out_trial_says_why_and_a_seed_without_prediction_shows_a_dash():
    note = trial_note({"source": "pippy-equal-size", "split_points": ["blocks.1.mlp"], "raced_out": "after 1 repeat"},
                      ["a", "blocks.1"], number=0, state="raced out")
    assert "**Raced out**: after 1 repeat" in note and "| predicted by the cost model | - |" in note


def test_the_study_note_says_how_to_read_the_trials():
    text = study_note({"model": "m", "stages": 2, "device": "cpu", "granularity": "block"}, 84, 2.0)
    assert "84 plans" in text and "Predictions are user attributes only" in text and "2.00x" in text
