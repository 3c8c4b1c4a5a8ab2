"""search.export's summary table, on rows as the study gives them (no trials run)."""

from search.export import summary_table


def test_summary_table_marks_the_best_and_a_failed_reference():
    rows = [{"role": "BEST", "source": "tpe", "trial": 7, "split_points": ["blocks.2"], "chunks": 4, "predicted": 1.8,
             "measured": 1.7, "confirmed": 1.65, "failed": None},
            {"role": "reference", "source": "pippy-equal-size", "trial": 0, "split_points": ["blocks.1.mlp.fc1"],
             "chunks": 2, "predicted": None, "measured": None, "confirmed": None, "failed": "rank 1 failed mid-trial"}]
    lines = summary_table(rows).splitlines()
    assert lines[2] == "| BEST | tpe | 7 | blocks.2 | 4 | 1.80 | 1.70 | 1.65 |"
    assert lines[3].startswith("| reference | pippy-equal-size | 0 | blocks.1.mlp.fc1 | 2 | - | failed: rank 1")
