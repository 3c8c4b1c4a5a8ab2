"""pipeline.export: a best_split.json-shaped document keeps every contract key and reads back as a plan; the CLI
prints a split in the training frameworks' formats."""

import subprocess
import sys

import pytest

from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.core.result import TrialResult
from pipeline.core.spec import ModelSpec
from pipeline.export import document, provenance


def test_document_has_the_contract_keys_and_is_a_plan_again():
    plan = SplitPlan(model=ModelSpec(name="m", batch_size=4), split_points=(SplitPoint("b.1"),), chunks=2)
    res = TrialResult(plan=plan, ok=True, serial_s=(2.0,), pipeline_s=(1.0,), serial_all_s=(1.5,))
    doc = document(plan, res, predicted={"speedup": 1.9}, command="test")
    for key in ("version", "model", "stages", "split_points", "chunks", "backend", "schedule", "device",
                "threads_per_stage", "measured", "predicted", "provenance"):
        assert key in doc
    for key in ("speedup", "speedup_spread", "serial_s", "pipeline_s", "stage_compute_s", "stage_comm_s",
                "boundary_bytes", "max_abs_diff", "speedup_all_threads", "serial_all_threads_s"):
        assert key in doc["measured"]
    assert doc["measured"]["speedup"] == 2.0 and doc["provenance"]["command"] == "test"
    assert SplitPlan.from_dict(doc) == plan
    assert {"host", "cpu", "torch", "date"} <= set(provenance())


LLAMA = {"num_hidden_layers": 4, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2,
         "num_key_value_heads": 1, "vocab_size": 128}


def _plan_file(tmp_path, name, kwargs, points, **extra):
    from pipeline.models.build import resolve_spec

    spec = resolve_spec(name, kwargs=kwargs, batch_size=8, seq_len=8 if name.startswith("hf:") else None)
    plan = SplitPlan(model=spec, split_points=tuple(SplitPoint(p) for p in points), chunks=4, **extra)
    path = tmp_path / "plan.json"
    plan.save(path)
    return path


def test_the_cli_prints_a_plan_in_each_framework_format(tmp_path, capsys):
    from pipeline.export import main

    path = _plan_file(tmp_path, "hf:llama", LLAMA, ["model.layers.2"], schedule="1F1B", mode="train")
    assert main(["--split", str(path), "--to", "megatron"]) == 0
    out = capsys.readouterr().out
    assert '--pipeline-model-parallel-layout "Et*2|t*2L"' in out and "not expressible" not in out
    assert main(["--split", str(path), "--to", "torchtitan", "--out", str(tmp_path / "t.txt")]) == 0
    out = capsys.readouterr().out
    assert '[["tok_embeddings", "layers.0", "layers.1"], ["layers.2", "layers.3", "norm", "lm_head"]]' in out
    assert (tmp_path / "t.txt").read_text() == out


def test_a_cut_inside_a_block_names_the_nearest_plan_the_format_can_express(tmp_path, capsys):
    from pipeline.export import main

    path = _plan_file(tmp_path, "hf:llama", LLAMA, ["model.layers.2.mlp"])
    assert main(["--split", str(path), "--to", "torchtitan"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("# not expressible")]
    assert len(lines) == 1 and "written instead: the nearest plan it can express, cut at [model.layers." in lines[0]


@pytest.mark.parametrize("make, args, message", [
    (lambda t: _plan_file(t, "resnet18", {"num_classes": 10}, ["layer3.0"]), ["--to", "megatron"],
     "resnet18 cannot be written in a framework's format: its layers form 4 stacks"),
    (lambda t: t / "missing.json", ["--to", "deepspeed"], "does not exist"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, make, args, message):
    from pipeline.export import main

    assert main(["--split", str(make(tmp_path)), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_the_module_runs_from_the_command_line():
    proc = subprocess.run([sys.executable, "-m", "pipeline.export", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--to {torchtitan,megatron,deepspeed}" in proc.stdout and "examples:" in proc.stdout
