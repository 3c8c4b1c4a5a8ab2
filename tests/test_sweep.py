"""search.sweep end to end on a tiny model: 2 and 3 stages, every policy in the report, valid PNGs, and
optuna-dashboard serving the uploaded timelines over HTTP."""

import json
import re
import urllib.request

import matplotlib.image
import pytest

from search.sweep import main
from tests.conftest import TINY_VIT_ARGS, dashboard

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

POLICIES = ("pippy-equal-size", "uniform", "params-balanced", "time-balanced", "flops-balanced", "costmodel-optimum")


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    argv = [*TINY_VIT_ARGS, "--stages", "2", "3", "--chunks", "2", "--trials", "1", "--repeats", "1",
            "--min-trial-seconds", "0", "--confirm-rounds", "1", "--threads-per-stage", "1", "--no-progress", "--seed", "1",
            "--storage", f"sqlite:///{tmp}/optuna.db", "--results-dir", str(tmp), "--name", "sw"]
    assert main(argv) == 0
    return tmp


def test_report_has_every_policy_per_stage_count(swept):
    text = (swept / "sw" / "report.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)
    for s in (2, 3):
        sec = next(x for x in sections if x.startswith(f"{s} stages (ideal {s}x)"))
        table_rows = [ln for ln in sec.splitlines() if ln.startswith("| ") and not ln.startswith("| ---")][1:]
        names = " ".join(ln.split("|")[1] for ln in table_rows)
        for p in POLICIES:
            assert p in names, (s, p, names)
        assert "**best**" in names
        assert "Where each loses:" in sec and "of an ideal" in sec
    data = json.loads((swept / "sw" / "sweep.json").read_text())
    assert {r["stages"] for r in data["rows"]} == {2, 3}


def test_pngs_exist_are_valid_and_linked(swept):
    text = (swept / "sw" / "report.md").read_text()
    for name in ("speedup_vs_stages", "predicted_vs_measured", "compute_comm", "timeline_best_s2",
                 "timeline_pippy_s2", "timeline_best_s3", "timeline_pippy_s3"):
        path = swept / "sw" / f"{name}.png"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert matplotlib.image.imread(path).ndim == 3
        assert f"]({name}.png)" in text


def test_dashboard_serves_uploaded_artifacts(swept):
    with dashboard(f"sqlite:///{swept}/optuna.db", "--artifact-dir", str(swept / "artifacts")) as base:
        studies = json.load(urllib.request.urlopen(f"{base}/api/studies", timeout=10))
        sid = next(s["study_id"] for s in studies["study_summaries"] if s["study_name"].endswith("-s2-b8-cpu"))
        detail = json.load(urllib.request.urlopen(f"{base}/api/studies/{sid}", timeout=10))
        trial = next(t for t in detail["trials"] if any(a["key"] == "timeline_artifact" for a in t["user_attrs"]))
        artifact = next(json.loads(a["value"]) if a["value"].startswith('"') else a["value"]
                        for a in trial["user_attrs"] if a["key"] == "timeline_artifact")
        body = urllib.request.urlopen(f"{base}/artifacts/{sid}/{trial['trial_id']}/{artifact}", timeout=10).read()
        assert body[:8] == b"\x89PNG\r\n\x1a\n"
        plots = detail.get("artifacts", [])
        one = next(a for a in plots if a["filename"] == "speedup_vs_stages.png")
        body = urllib.request.urlopen(f"{base}/artifacts/{sid}/{one['artifact_id']}", timeout=10).read()
        assert body[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_only_rebuilds_the_report_from_the_studies(swept):
    report = swept / "sw" / "report.md"
    before = report.read_text()
    (swept / "sw" / "compute_comm.png").unlink()
    argv = [*TINY_VIT_ARGS, "--stages", "2", "3", "--storage", f"sqlite:///{swept}/optuna.db",
            "--results-dir", str(swept), "--name", "sw", "--report-only"]
    assert main(argv) == 0
    strip = lambda t: re.sub(r"measured \d{4}-\d\d-\d\d \d\d:\d\d", "", t)  # noqa: E731
    assert strip(report.read_text()) == strip(before)
    assert (swept / "sw" / "compute_comm.png").exists()


@pytest.mark.parametrize("extra, message", [
    (["--stages", "2", "1"], "--stages 1: every stage count must be at least 2"),
    (["--stages", "2", "40"], "--stages 40 is too many"),
    (["--stages", "2", "--report-only"], "--report-only: "),
])
def test_bad_stage_counts_fail_before_anything_runs(capsys, tmp_path, extra, message):
    assert main([*TINY_VIT_ARGS, *extra, "--storage", f"sqlite:///{tmp_path}/o.db", "--results-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "o.db").exists()
