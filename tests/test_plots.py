"""The sweep's PNGs are written and are valid images (matplotlib reads them back)."""

import matplotlib.image

from pipeline.stage.timeline import Timeline
from search.outputs.plots import compute_comm, predicted_vs_measured, speedup_vs_stages
from tests.conftest import good_timeline as good
from tests.conftest import report_row as row


def valid_png(path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and matplotlib.image.imread(path).ndim == 3


def test_speedup_vs_stages(tmp_path):
    rows = [row(), row(stages=3, measured=2.0, spread=(1.9, 2.1)), row(best=True, source="pippy-equal-size")]
    assert valid_png(speedup_vs_stages(rows, tmp_path / "s.png"))
    assert valid_png(speedup_vs_stages(rows, tmp_path / "t.png", "throughput"))  # samples/s, no S-fold line


def test_predicted_vs_measured(tmp_path):
    assert valid_png(predicted_vs_measured([(2, 1.8, 1.7), (3, 2.5, 2.1)], tmp_path / "p.png"))
    assert valid_png(predicted_vs_measured([(4, 0.78, 0.79)], tmp_path / "t.png", figure="throughput"))


def test_compute_comm(tmp_path):
    tl: Timeline = good()
    assert valid_png(compute_comm({"2 stages, best": tl, "2 stages, PiPPy": tl}, tmp_path / "c.png"))
