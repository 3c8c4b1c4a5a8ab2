"""The dashboard notes, as text (a real search saves them: test_optimize reads them back)."""

from search.notes import study_note, trial_note


def test_a_trial_note_shows_the_plan_by_name_and_predicted_beside_measured():
    attrs = {"source": "sampler", "split_points": ["blocks.3"], "chunks": 8, "speedup": 1.71, "repeats": 3,
             "speedup_spread": [1.65, 1.8], "predicted_speedup": 1.9, "calibrated_speedup": 1.75,
             "peak_mem_bytes": [200 * 2**20, 100 * 2**20]}
    names = ["patch_embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "blocks.4", "head"]
    note = trial_note(attrs, names, number=7, state="measured", timeline_url="/artifacts/1/7/abc")
    assert note.startswith("## Trial 7: measured (sampler)")
    assert "- stage 1: patch_embed..blocks.2" in note and "- stage 2: blocks.3..head" in note
    assert "| measured (median of 3 repeats) | 1.71x |" in note and "| predicted by the cost model | 1.90x |" in note
    assert "200 MiB, 100 MiB" in note and "![measured timeline](/artifacts/1/7/abc)" in note


def test_a_raced_out_trial_says_why_and_a_seed_without_prediction_shows_a_dash():
    note = trial_note({"source": "pippy-equal-size", "split_points": ["blocks.1.mlp"], "raced_out": "after 1 repeat"},
                      ["a", "blocks.1"], number=0, state="raced out")
    assert "**Raced out**: after 1 repeat" in note and "| predicted by the cost model | - |" in note


def test_the_study_note_says_how_to_read_the_trials():
    text = study_note({"model": "m", "stages": 2, "device": "cpu", "granularity": "block"}, 84, 2.0)
    assert "84 plans" in text and "Predictions are user attributes only" in text and "2.00x" in text
