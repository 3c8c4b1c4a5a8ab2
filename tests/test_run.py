"""The pipeline.run CLI: through main(argv) and as a subprocess, good runs and one-line errors."""

import json
import subprocess
import sys

import pytest

from pipeline.core.plan import SplitPlan
from pipeline.run import main
from tests.conftest import TINY_VIT_ARGS


def test_help_explains_with_examples(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--policy" in out and "examples:" in out and "equal-size" in out


@pytest.mark.parametrize("argv, message", [
    (["--stages", "2"], "say where to cut"),
    (["--policy", "equal-size"], "--policy needs --stages N"),
    (["--stages", "9", "--policy", "uniform"], "--stages 9 is too many"),
    (["--split-points", "blocks.3,blocks.1"], "out of execution order"),
    (["--split-points", "blocks.1", "--stages", "3"], "--stages 3 does not match 1 split points"),
    (["--split-points", "blocks.1", "--chunks", "3"], "chunks 3 does not divide batch size 8"),
    (["--split-points", "nope.1"], "'nope.1' is not a module"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    assert main([*TINY_VIT_ARGS, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_unknown_model_and_bad_kwargs(capsys):
    assert main(["--model", "no_such_net", "--stages", "2", "--policy", "uniform"]) == 2
    assert "unknown timm model 'no_such_net'" in capsys.readouterr().err
    assert main(["--model-kwargs", "{depth: 2}", "--stages", "2", "--policy", "uniform"]) == 2
    assert "--model-kwargs is not valid JSON" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.multiprocess
def test_policy_run_writes_a_best_split_that_runs_again(tmp_path, capsys):
    out = tmp_path / "result.json"
    code = main([*TINY_VIT_ARGS, "--stages", "2", "--policy", "equal-size", "--chunks", "4",
                 "--repeats", "1", "--threads-per-stage", "1", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "cut at [blocks." in text and "speedup" in text
    doc = json.loads(out.read_text())
    assert doc["measured"]["ok"] and doc["measured"]["speedup"] > 0
    assert doc["provenance"]["torch"] and doc["stages"] == 2
    again = tmp_path / "again.json"
    png, traces = tmp_path / "timeline.png", tmp_path / "traces"
    proc = subprocess.run([sys.executable, "-m", "pipeline.run", "--split", str(out), "--repeats", "1",
                           "--no-serial-all", "--out", str(again), "--timeline", str(png), "--profile", str(traces)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert SplitPlan.load(again) == SplitPlan.load(out)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in traces.iterdir()) == ["rank0.json", "rank1.json"]
    assert "SyncActivityProfilerHandler" not in proc.stderr  # the profiler's C++ chatter is kept quiet


def test_split_with_model_flags_is_refused(tmp_path, capsys, tiny_spec):
    from pipeline.core.plan import SplitPoint

    path = tmp_path / "plan.json"
    SplitPlan(model=tiny_spec, split_points=(SplitPoint("blocks.2"),), chunks=2).save(path)
    assert main(["--split", str(path), "--chunks", "4"]) == 2
    assert "--split runs the saved plan as it is: drop --chunks" in capsys.readouterr().err


def test_subprocess_error_has_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "pipeline.run", "--split", "/nonexistent.json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: plan file /nonexistent.json does not exist: pass the path of a " \
                                  "best_split.json or plan JSON"
