"""The sweep report: block ranges, loss factors, readings and tables (pure)."""

import math

import pytest

from search.trials.report import PolicyRow, losses, markdown, reading, stage_ranges, table
from tests.conftest import report_row as row

SEGS = ["patch_embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "norm", "head"]


def test_stage_ranges_name_first_and_last_block_per_stage():
    assert stage_ranges(["blocks.2"], SEGS) == ["patch_embed..blocks.1", "blocks.2..head"]
    assert stage_ranges(["blocks.1", "head"], SEGS) == ["patch_embed..blocks.0", "blocks.1..norm", "head"]
    # PiPPy cuts inside a block: the stage ends 'before' that op
    assert stage_ranges(["blocks.1.mlp.fc2"], SEGS) == ["patch_embed..(before blocks.1.mlp.fc2)",
                                                        "blocks.1.mlp.fc2..head"]


def test_losses_are_the_factors_named_in_the_docstring():
    f = losses(row())
    assert f["imbalance"] == pytest.approx(1.0 / 0.75)
    assert f["compute"] == pytest.approx(1.0)
    assert f["bubbles"] == pytest.approx(1 / (1 - 1 / 5))
    assert f["communication"] == pytest.approx(1 / (1 - 0.05 / 1.0))


def test_reading_names_the_largest_loss_first():
    text = reading(row())
    assert text.startswith("uniform: 1.50x of an ideal 2x; loses most to imbalance")
    assert "1.33x the mean" in text and "20%" in text
    assert reading(row(failed="rank 1 died")) == "uniform: failed (rank 1 died)."
    assert "failed in the confirmation round" in reading(row(measured=math.nan))


def test_table_lists_every_row_best_first_and_markdown_links_plots():
    rows = [row(), row(source="pippy-equal-size", trial=0, predicted=None),
            row(source="costmodel-optimum+time-balanced", trial=1, best=True, measured=1.7),
            row(source="flops-balanced", trial=4, failed="output check failed", measured=math.nan)]
    t = table(rows)
    lines = t.splitlines()[2:]
    assert len(lines) == 4
    assert lines[0].startswith("| **best** (costmodel-optimum+time-balanced)")
    assert lines[1].startswith("| pippy-equal-size") and "| - |" in lines[1]
    assert "failed: output check failed" in t
    md = markdown("t", rows, plots={"speedup_vs_stages": "s.png", "timeline_best_s2": "tb.png"},
                  meta={"model": "m", "batch_size": 8, "device": "cpu", "threads": "1"})
    assert "## 2 stages (ideal 2x)" in md and "![speedup_vs_stages](s.png)" in md and "(tb.png)" in md
    assert "Best 1.70x vs PiPPy's equal-size 1.50x: 1.13x better" in md
    assert "Their spreads overlap" in md  # both span 1.4-1.6
    solo = markdown("t", [row(source="pippy-equal-size", best=True)], plots={}, meta={})
    assert "The best plan is PiPPy's equal-size split: 1.50x, 75% of the ideal." in solo
    assert PolicyRow.from_dict(rows[0].to_dict()) == rows[0]
    thru = markdown("t", rows, plots={}, meta={"objective": "throughput"})
    assert "Figures are throughput (samples/s" in thru and "## 2 stages\n" in thru and "ideal 2x" not in thru
    assert "Best 1.7 samples/s vs PiPPy's equal-size 1.5 samples/s: 1.13x better." in thru
    assert rows[2].policies == ["costmodel-optimum", "time-balanced"]


def test_each_row_puts_the_predicted_step_and_peak_per_stage_beside_the_measured():
    rows = [row(predicted_s=0.5, measured_s=0.61, predicted_mib=(1100, 1050), peak_mib=(1120, 1040)),
            row(source="pippy-equal-size", trial=0, predicted=None, peak_mib=(900, 800))]
    lines = table(rows).splitlines()
    assert "step s predicted / measured" in lines[0] and "peak MiB per stage predicted / measured" in lines[0]
    uniform, pippy = (next(x for x in lines if x.startswith(f"| {n}")) for n in ("uniform", "pippy-equal-size"))
    assert uniform.endswith("| 0.50 / 0.61 | 1100, 1050 / 1120, 1040 |")
    assert pippy.endswith("| - | - / 900, 800 |")  # nothing predicted: the measured figures alone
    assert PolicyRow.from_dict(rows[0].to_dict()) == rows[0]


def test_a_speedup_above_the_machines_ceiling_is_flagged_where_the_report_shows_it():
    rows = [row(stages=3, source="uniform", trial=1, best=True, measured=2.04, spread=(1.9, 2.1)),
            row(stages=3, source="pippy-equal-size", trial=0, measured=1.8, spread=(1.7, 1.9))]
    md = markdown("t", rows, plots={}, meta={"ceilings": {"3": 2.0}})
    assert "This machine's ceiling is 2.00x for 3 stages" in md
    best, pippy = (ln for ln in md.splitlines() if ln.startswith(("| **best**", "| pippy")))
    assert "| 2.04 (above the 2.00x ceiling: noise) |" in best and "ceiling" not in pippy
    assert "ceiling" not in markdown("t", rows, plots={}, meta={"objective": "throughput", "ceilings": {"3": 2.0}})
