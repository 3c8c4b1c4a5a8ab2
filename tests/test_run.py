"""The pipeline.run CLI: through main(argv) and as a subprocess, good runs and one-line errors."""

import contextlib
import dataclasses
import io
import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
    (["--stages", "3", "--policy", "megatron"], "policy megatron cannot split 3 stages: Megatron-Core refuses 4 layers "
     "on 3 stages: num_layers should be divisible by pipeline_model_parallel_size"),
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


# ---- plan files as users write them: every bad field is one line, a missing input shape is derived ----

def _plan_file(tmp_path, spec, mutate=None, name="plan.json"):
    from pipeline.core.plan import SplitPoint

    d = SplitPlan(model=spec, split_points=(SplitPoint("blocks.2"),), chunks=2).to_dict()
    if mutate:
        mutate(d)
    path = tmp_path / name
    path.write_text(json.dumps(d))
    return path


RUN_FAST = ["--repeats", "1", "--warmup", "0", "--no-serial-all"]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_plan_without_input_shape_runs_at_the_models_own_size(tmp_path, capsys, tiny_spec):
    """A hand-written plan has no model.input_shape: it runs at the size the model takes (32 px here), not 224."""
    path = _plan_file(tmp_path, tiny_spec, lambda d: d["model"].pop("input_shape"))
    assert main(["--split", str(path), *RUN_FAST]) == 0, capsys.readouterr()
    assert "speedup" in capsys.readouterr().out


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["model"].update(input_shape=[3, 224, 224]),
     "model.input_shape [3, 224, 224] does not fit deit_tiny_patch16_224 with kwargs"),
    (lambda d: d.update(chunks="two"), "chunks 'two' must be an integer"),
    (lambda d: d.update(stages="2"), "stages '2' must be an integer"),
    (lambda d: d.update(threads_per_stage=1.5), "threads_per_stage 1.5 must be an integer"),
    (lambda d: d["model"].update(batch_size="8"), "model.batch_size '8' must be an integer"),
    (lambda d: d["model"].update(kwargs=[1]), "model.kwargs [1] must be a JSON object"),
    (lambda d: d.update(split_points="blocks.1"), "split_points 'blocks.1' must be a list of"),
    (lambda d: d["split_points"][0].update(kind=3), "split point 'blocks.2' kind 3 must be a string"),
    (lambda d: d["split_points"][0].update(kind="MIDDLE"), "kind 'MIDDLE' for 'blocks.2' is unknown"),
    (lambda d: d["split_points"].append(dict(d["split_points"][0])), "split point blocks.2:BEGINNING is repeated"),
])
def test_a_bad_plan_field_is_one_line_naming_field_value_and_type(tmp_path, capsys, tiny_spec, mutate, message):
    path = _plan_file(tmp_path, tiny_spec, mutate)
    out = tmp_path / "out.json"
    assert main(["--split", str(path), *RUN_FAST, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not out.exists()


@pytest.mark.parametrize("argv, message", [
    (["--stages", "0", "--policy", "uniform"], "a pipeline needs at least 2 ranks: --stages 0 is no rank"),
    (["--stages", "1", "--stages-per-rank", "2", "--policy", "uniform", "--schedule", "Interleaved1F1B"],
     "a pipeline needs at least 2 ranks: --stages 1 with --stages-per-rank 2 is one rank; use --stages 2"),
    (["--split-points", "blocks.1,blocks.2", "--stages-per-rank", "2", "--schedule", "Interleaved1F1B"],
     "2 split points make 3 stages, which do not split into 2 per rank"),
    (["--split-points", "blocks.1", "--stages", "2", "--stages-per-rank", "2", "--schedule", "Interleaved1F1B"],
     "--stages 2 with --stages-per-rank 2 does not match 1 split points (2 stages on 1 ranks): --stages counts "
     "ranks, so give 3 split points or --stages 1"),
    (["--stages", "2", "--policy", "uniform", "--timeout", "-1"], "--timeout must be a positive number"),
    (["--stages", "2", "--policy", "uniform", "--chunks", "a"], "argument --chunks: invalid int value: 'a'"),
    (["--split-points", "blocks.1,blocks.1"], "split point blocks.1:BEGINNING is repeated"),
    (["--stages", "2", "--policy", "uniform", "--out", "/proc/no/such/out.json"], "cannot write /proc/no/such/out.json"),
    (["--stages", "2", "--policy", "uniform", "--stages-per-rank", "0"],
     "argument --stages-per-rank: must be a positive integer (got 0)"),
    (["--stages", "2", "--policy", "uniform", "--threads-per-stage", "0"],
     "argument --threads-per-stage: must be a positive integer (got 0)"),
    (["--stages", "2", "--policy", "uniform", "--mode", "train", "--recompute", "lots"],
     "--recompute 'lots' is not a recomputation: use none, full, or one count of blocks per stage"),
    (["--stages", "2", "--policy", "uniform", "--mode", "train", "--recompute", "1,1,1"],
     "--recompute 1,1,1 gives 3 counts for 2 stages"),
    (["--split-points", "blocks.2", "--dp-shard", "2"],
     "--dp-shard 2 shards training state (weights, gradients, optimizer state); forward-only runs are not sharded"),
    (["--split-points", "blocks.2", "--dp-shard", "2", "--mode", "train", "--chunks", "8"],
     "batch size 8 does not split into 2 replicas x 8 chunks"),
    (["--split-points", "blocks.2", "--dp-shard", "2", "--backend", "pippy"], "--dp-shard 2 runs on the torch backend"),
    (["--split-points", "blocks.2", "--mode", "train", "--recompute", "3,0"],
     "--recompute asks stage 0 to recompute 3 blocks, but it holds 2: give at most 2,2"),
])
def test_more_bad_flags_are_one_line(capsys, argv, message):
    with contextlib.suppress(SystemExit):
        assert main([*TINY_VIT_ARGS, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_a_pickle_that_is_no_state_dict_is_one_line_without_torchs_warnings(tmp_path):
    import pickle

    ckpt = tmp_path / "list.pkl"
    ckpt.write_bytes(pickle.dumps([1, 2], protocol=4))  # torch.load warns about the protocol before refusing it
    proc = subprocess.run([sys.executable, "-m", "pipeline.run", *TINY_VIT_ARGS, "--checkpoint", str(ckpt), "--stages",
                           "2", "--policy", "uniform"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: checkpoint {ckpt} could not be read") and proc.stderr.count("\n") == 1, proc.stderr


def test_a_checkpoint_that_does_not_fit_names_its_first_missing_and_unexpected_keys(tmp_path, capsys):
    import torch

    ckpt = tmp_path / "w.pt"
    torch.save({"head.weight": torch.zeros(1), "nonsense": torch.zeros(1)}, ckpt)
    assert main([*TINY_VIT_ARGS, "--checkpoint", str(ckpt), "--stages", "2", "--policy", "uniform"]) == 2
    err = capsys.readouterr().err
    assert "does not fit deit_tiny_patch16_224" in err and err.count("\n") == 1, err
    assert ("missing key(s), first" in err and "unexpected key(s), first 'nonsense'" in err) or "size mismatch" in err


JUNK = st.one_of(st.none(), st.booleans(), st.integers(-3, 40), st.floats(allow_nan=True, allow_infinity=True),
                 st.text(max_size=8), st.lists(st.integers(-1, 5), max_size=3),
                 st.dictionaries(st.text(max_size=3), st.integers(-1, 3), max_size=2))
FIELDS = [("version",), ("model",), ("model", "name"), ("model", "kwargs"), ("model", "batch_size"),
          ("model", "input_shape"), ("model", "dtype"), ("model", "checkpoint"), ("model", "seed"), ("stages",),
          ("split_points",), ("split_points", 0), ("split_points", 0, "fqn"), ("split_points", 0, "kind"),
          ("chunks",), ("backend",), ("schedule",), ("device",), ("threads_per_stage",), ("mode",), ("optimizer",),
          ("stages_per_rank",)]


@pytest.mark.slow
@pytest.mark.multiprocess
@settings(max_examples=14, deadline=None, suppress_health_check=list(HealthCheck))
@given(where=st.sampled_from(FIELDS), delete=st.booleans(), value=JUNK)
def test_any_one_broken_field_gives_a_result_or_one_short_line(tmp_path_factory, tiny_spec, where, delete, value):
    """A valid plan with one field deleted or replaced by junk: exit 0 with a result, 1 with a failed trial's
    reason, or 2 with at most 3 lines on stderr; never a traceback, and no --out file unless it succeeded."""
    tmp = tmp_path_factory.mktemp("junk")

    def mutate(d):
        *parents, last = where
        for k in parents:
            d = d[k]
        if delete and isinstance(d, dict):
            d.pop(last, None)
        else:
            d[last] = value

    path = _plan_file(tmp, tiny_spec, mutate)
    out = tmp / "out.json"
    err, std = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
        code = main(["--split", str(path), *RUN_FAST, "--timeout", "120", "--out", str(out)])
    text = err.getvalue()
    assert "Traceback" not in text and "Traceback" not in std.getvalue(), (where, value, text)
    assert code in (0, 1, 2), (where, value, code)
    if code == 2:
        assert 1 <= text.count("\n") <= 3 and text.startswith(("error:", "warning:")), (where, value, text)
    assert out.exists() == (code == 0), (where, value, code)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(chunks="two"), "chunks 'two' must be an integer"),
    (lambda d: d.update(split_points="blocks.1"), "split_points 'blocks.1' must be a list of"),
    (lambda d: d.pop("model"), "the plan has no 'model' key"),
])
def test_bad_plan_files_as_subprocesses(tmp_path, tiny_spec, mutate, message):
    path = _plan_file(tmp_path, tiny_spec, mutate)
    proc = subprocess.run([sys.executable, "-m", "pipeline.run", "--split", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_version_1_plan_file_with_two_stages_per_rank_runs_as_it_did(tmp_path, capsys, tiny_spec):
    """A plan file written before --stages counted ranks (version 1: ``stages`` 4 for 4 pieces on 2 ranks)."""
    from pipeline.core.plan import SplitPoint

    plan = SplitPlan(model=tiny_spec, split_points=tuple(SplitPoint(f"blocks.{i}") for i in (1, 2, 3)), chunks=4,
                     schedule="Interleaved1F1B", stages_per_rank=2, threads_per_stage=1)
    old = {k: v for k, v in plan.to_dict().items() if k != "total_stages"}
    old.update(version=1, stages=4)
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(old))
    out = tmp_path / "again.json"
    assert main(["--split", str(path), "--repeats", "1", "--warmup", "0", "--no-serial-all", "--out", str(out)]) == 0
    assert "plan: 4 stages on 2 ranks, 2 per rank cut at [blocks.1, blocks.2, blocks.3]" in capsys.readouterr().out
    again = json.loads(out.read_text())
    assert (again["version"], again["stages"], again["stages_per_rank"], again["total_stages"]) == (3, 2, 2, 4)
    assert SplitPlan.from_dict(again) == plan


def test_a_plan_over_device_memory_is_refused_before_anything_is_built(capsys, monkeypatch):
    import pipeline.run as run

    def never(*a, **k):
        raise AssertionError("a pool ran a plan over the budget")

    monkeypatch.setattr(run, "run_plan", never)
    assert main([*TINY_VIT_ARGS, "--stages", "2", "--policy", "uniform", "--device-memory", "64MiB"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: rank ") and "over --device-memory 64 MiB: nothing was built; use more stages" in err
    assert err.count("\n") == 1


@pytest.mark.multiprocess
def test_without_a_serial_baseline_a_run_reports_throughput_and_its_stages(pool2, tiny_spec):
    from pipeline.core.plan import SplitPoint
    from pipeline.run import RunConfig, format_result, run_plan

    plan = SplitPlan(model=tiny_spec, split_points=(SplitPoint("blocks.2"),), chunks=2)
    r = run_plan(plan, RunConfig(repeats=2, serial=False))
    assert r.ok and r.serial_s == () and r.serial_all_s == () and len(r.pipeline_s) == 2
    assert r.throughput == pytest.approx(8 / sorted(r.pipeline_s)[0], rel=1) and r.tokens_per_s is None
    text = format_result(r)
    assert "no speedup: the serial model was not timed" in text and "samples/s" in text
    # a serial run three times the pipeline's on a machine whose cores give 2 stages at most 2x: flagged as noise
    noisy = dataclasses.replace(r, serial_s=tuple(3 * p for p in r.pipeline_s))
    assert "speedup 3.00x (spread 3.00-3.00 over 2 repeats) vs the serial model on one stage's threads: above the " \
           "2.00x ceiling: noise (the most this machine's cores can give 2 stages of 1 thread(s)" in format_result(noisy, 2.0)
    assert "above the" not in format_result(noisy, 4.0) and "above the" not in format_result(noisy)
    assert r.check is not None and r.check.whole_diff is None and r.check.streamed_diff is not None
    from pipeline.models.build import build_meta_model
    from pipeline.models.candidates import find_candidates
    from pipeline.models.footprint import stage_bytes

    meta = build_meta_model(tiny_spec)
    assert list(r.stage_bytes) == list(stage_bytes(meta, tiny_spec, find_candidates(meta, tiny_spec), plan).weights)
    assert r.to_dict()["throughput"] == r.throughput


def test_torchpippy_under_a_budget_the_whole_model_exceeds_points_to_the_torch_backend(capsys, monkeypatch):
    import pipeline.models.footprint as footprint
    from pipeline.core.budget import MemoryPrediction, RankMemory

    def fits_split_not_whole(plan, meta, cands, budget=None, runtime=None, leaves=None):
        ranks = tuple(RankMemory(rank=r, weights=2**20, train_state=0, activations=0, runtime=0) for r in range(2))
        return MemoryPrediction(ranks=ranks, whole=2**31, budget=2**30)

    monkeypatch.setattr(footprint, "predict_plan", fits_split_not_whole)
    assert main([*TINY_VIT_ARGS, "--split-points", "blocks.2", "--backend", "pippy", "--device-memory", "1GiB"]) == 2
    err = capsys.readouterr().err
    assert "torchpippy 0.2 traces the whole model on every rank" in err and "use --backend torch" in err
    assert err.count("\n") == 1


def test_a_model_built_whole_off_meta_over_the_budget_says_how_to_make_it_meta_friendly(tmp_path, capsys, monkeypatch):
    import pipeline.models.footprint as footprint
    from pipeline.core.budget import MemoryPrediction, RankMemory

    f = tmp_path / "cpu_only.py"
    f.write_text("import torch\nfrom torch import nn\n\n"
                 "def build():\n"
                 "    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))\n"
                 "    m[0].weight.data[0, 0] = float(m[0].weight.data[0, 0].item())\n"
                 "    return m, torch.randn(4, 4)\n")

    def fits_split_not_whole(plan, meta, cands, budget=None, runtime=None, leaves=None):
        ranks = tuple(RankMemory(rank=r, weights=2**20, train_state=0, activations=0, runtime=0) for r in range(2))
        return MemoryPrediction(ranks=ranks, whole=2**31, budget=2**30)

    monkeypatch.setattr(footprint, "predict_plan", fits_split_not_whole)
    with pytest.warns(UserWarning, match="cannot be built on the meta device"):
        code = main(["--model-factory", f"{f}:build", "--split-points", "2", "--device-memory", "1GiB"])
    assert code == 2
    err = capsys.readouterr().err
    assert "cannot be built on the meta device, and built whole it needs about 2.00 GiB" in err
    assert "make its constructor meta-friendly" in err and err.count("\n") == 1


def test_a_refused_plan_names_the_fewest_ranks_that_would_fit(capsys, monkeypatch, tiny_spec):
    import pipeline.models.footprint as footprint
    import pipeline.run as run
    from pipeline.core.plan import SplitPlan
    from pipeline.models.build import build_meta_model
    from pipeline.models.candidates import find_candidates

    monkeypatch.setattr(footprint, "resident_bytes", lambda: 0)  # the weights and activations alone decide
    monkeypatch.setattr(run, "run_plan", lambda *a, **k: pytest.fail("a plan over the budget ran"))
    meta = build_meta_model(tiny_spec)
    cands = find_candidates(meta, tiny_spec)

    def worst(ranks):
        plan = SplitPlan(model=tiny_spec, split_points=cands.policy_points("uniform", ranks), chunks=1)
        return footprint.predict_plan(plan, meta, cands, 2**40).worst.total

    budget = (worst(2) + min(worst(3), worst(4))) // 2
    assert main([*TINY_VIT_ARGS, "--stages", "2", "--policy", "uniform", "--device-memory", str(budget)]) == 2
    err = capsys.readouterr().err
    assert "--policy uniform would fit" in err and err.count("\n") == 1
    fits = int(err.split("(--stages ")[1].split()[0])
    assert fits in (3, 4) and worst(fits) <= budget


def test_rank_0_times_the_serial_model_only_where_the_whole_model_fits_beside_its_stage():
    """A Llama of 430 MiB on meta: with room, rank 0's prediction holds the whole model too; with a budget the
    whole model fits alone but not beside rank 0's stage, no serial baseline is timed (and the run says so)."""
    from pipeline.core.plan import SplitPoint
    from pipeline.models.build import resolve_spec
    from pipeline.run import check_memory, describe_memory

    kw = {"num_hidden_layers": 6, "hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 4,
          "num_key_value_heads": 4, "vocab_size": 8000}
    plan = SplitPlan(model=resolve_spec("hf:llama", kwargs=kw, batch_size=4, seq_len=16),
                     split_points=(SplitPoint("model.layers.3"),), chunks=2)
    roomy = check_memory(plan, 64 * 2**30)
    assert roomy.ranks[0].serial == roomy.whole - roomy.ranks[0].runtime and roomy.ranks[1].serial == 0
    tight = check_memory(plan, roomy.whole + roomy.ranks[0].weights // 2)
    assert tight.serial_fits and tight.ranks[0].serial == 0
    assert "fits one device but not beside rank 0's stage: no serial baseline is timed" in describe_memory(tight)


def test_a_training_plan_over_the_budget_is_told_the_least_recomputation_that_fits(capsys, monkeypatch, tiny_spec):
    import pipeline.models.footprint as fp
    import pipeline.run as run
    from pipeline.core.plan import SplitPoint
    from pipeline.models.build import build_meta_model
    from pipeline.models.candidates import find_candidates

    def never(*a, **k):
        raise AssertionError("a pool ran a plan over the budget")

    monkeypatch.setattr(run, "run_plan", never)
    monkeypatch.setattr(fp, "resident_bytes", lambda: 0)  # the runtime out of the figures: the data decide
    meta = build_meta_model(tiny_spec)
    cands = find_candidates(meta, tiny_spec)
    plan = SplitPlan(model=tiny_spec, split_points=(SplitPoint("blocks.2"),), chunks=1, mode="train")
    none = fp.predict_plan(plan, meta, cands, budget=2**40).worst.total
    full = fp.predict_plan(dataclasses.replace(plan, recompute="full"), meta, cands, budget=2**40).worst.total
    assert full < none
    budget = (full + none) // 2
    args = [*TINY_VIT_ARGS, "--split-points", "blocks.2", "--mode", "train", "--device-memory", str(budget)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "nothing was built; use --recompute " in err and "(the fewest blocks recomputed per stage that fit)" in err
    fix = err.split("use --recompute ")[1].split(" ")[0]
    fixed = dataclasses.replace(plan, recompute=fix)
    assert fp.predict_plan(fixed, meta, cands, budget=2**40).worst.total <= budget  # and it does fit


def test_inference_says_once_that_it_ignores_recomputation(capsys):
    assert main([*TINY_VIT_ARGS, "--stages", "2", "--policy", "uniform", "--recompute", "full",
                 "--device-memory", "64MiB"]) == 2
    out = capsys.readouterr().out
    assert out.count("--recompute full is ignored: inference runs no backward") == 1
