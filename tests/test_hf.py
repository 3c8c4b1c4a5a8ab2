"""pipeline.models.hf: transformers models from their config, token inputs, and bad input as one line."""

import json
import subprocess
import sys

import pytest
import torch

from pipeline.core.errors import PipesplitError
from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.models.batch import example_input
from pipeline.models.build import build_model, resolve_spec
from pipeline.models.candidates import find_candidates

GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 128, "n_positions": 32}
LLAMA = {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2,
         "num_key_value_heads": 1, "vocab_size": 128}


def test_gpt2_takes_token_ids_and_returns_logits():
    spec = resolve_spec("hf:gpt2", kwargs=GPT2, batch_size=2, seq_len=8)
    assert (spec.source, spec.name, spec.label, spec.input_shape, spec.input_high) == ("hf", "gpt2", "hf:gpt2", (8,), 128)
    (x,) = example_input(spec)
    assert x.dtype == torch.int64 and int(x.max()) < 128
    with torch.no_grad():
        assert build_model(spec)(x).shape == (2, 8, 128)


@pytest.mark.parametrize("name, kwargs, stack", [("hf:gpt2", GPT2, "transformer.h."), ("hf:llama", LLAMA, "model.layers.")])
def test_decoder_stacks_are_block_candidates_with_embeddings_and_head(name, kwargs, stack):
    spec = resolve_spec(name, kwargs=kwargs, batch_size=2, seq_len=8)
    blocks = find_candidates(build_model(spec), spec).blocks
    assert [b for b in blocks if b.startswith(stack)] == [stack + "0", stack + "1"]
    assert blocks[-1] == "lm_head" and ("embed" in blocks[0] or "wte" in blocks[0])


def test_gpt2_ties_its_head_to_its_embedding():
    model = build_model(resolve_spec("hf:gpt2", kwargs=GPT2, batch_size=2, seq_len=8))
    assert model.lm_head.weight is model.transformer.wte.weight


def test_the_spec_round_trips_through_json():
    spec = resolve_spec("hf:gpt2", kwargs=GPT2, batch_size=2, seq_len=8)
    plan = SplitPlan(model=spec, split_points=(SplitPoint("transformer.h.1"),), chunks=2)
    again = SplitPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again.model == spec and torch.equal(example_input(again.model)[0], example_input(spec)[0])


@pytest.mark.parametrize("name, kwargs, seq, message", [
    ("hf:gtp2", {}, None, r"unknown transformers model type 'gtp2' \(did you mean hf:gpt2"),
    ("hf:gpt2", {"n_layers": 2}, None, r"key 'n_layers' is not a setting of GPT2Config \(did you mean n_layer"),
    ("hf:gpt2", {"n_embd": 30, "n_head": 4, "n_layer": 1}, None, "hf:gpt2"),
    ("hf:gpt2", GPT2, 64, r"--seq-len 64 is over hf:gpt2's maximum of 32 positions"),
    ("hf:gpt2", GPT2, 0, "--seq-len must be a positive integer"),
])
def test_bad_hf_input_is_one_line(name, kwargs, seq, message):
    with pytest.raises(PipesplitError, match=message) as e:
        resolve_spec(name, kwargs=kwargs, batch_size=2, seq_len=seq)
    assert "\n" not in str(e.value)


def test_missing_transformers_names_the_pip_command(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_transformers(name, *a, **k):
        if name == "transformers" or name.startswith("transformers."):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_transformers)
    with pytest.raises(PipesplitError, match=r"pip install -e '\.\[hf\]'"):
        resolve_spec("hf:gpt2", kwargs=GPT2)


def _argv(name, kwargs):
    return ["--model", name, "--model-kwargs", json.dumps(kwargs), "--seq-len", "8", "--batch-size", "4",
            "--chunks", "2", "--repeats", "1", "--warmup", "0", "--no-serial-all"]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("name, kwargs, cut", [("hf:gpt2", GPT2, "transformer.h.1"), ("hf:llama", LLAMA, "model.layers.1")])
@pytest.mark.parametrize("backend", ["torch", "pippy"])
def test_two_stage_language_models_match_the_unsplit_model_and_rerun_from_their_plan(tmp_path, capsys, name, kwargs,
                                                                                        cut, backend):
    from pipeline.run import main

    out = tmp_path / "best_split.json"
    assert main([*_argv(name, kwargs), "--split-points", cut, "--backend", backend, "--out", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["model"]["source"] == "hf" and saved["measured"]["max_abs_diff"] <= 1e-4
    if backend == "torch":  # the plan reruns the same on either backend: once is enough (it costs a pool)
        assert main(["--split", str(out), "--repeats", "1", "--warmup", "0", "--no-serial-all"]) == 0
        assert "output check: max |diff|" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_short_search_on_tiny_gpt2_exports_a_plan_that_pipeline_run_reruns(tmp_path):
    from search.optimize import main

    args = ["--model", "hf:gpt2", "--model-kwargs", json.dumps(GPT2), "--seq-len", "8", "--batch-size", "4",
            "--stages", "2", "--chunks", "1,2", "--trials", "3", "--repeats", "1", "--min-trial-seconds", "0",
            "--confirm-top", "1", "--confirm-rounds", "1", "--threads-per-stage", "1", "--no-progress",
            "--no-artifacts", "--storage", f"sqlite:///{tmp_path}/o.db", "--results-dir", str(tmp_path)]
    assert main(args) == 0
    (plan,) = tmp_path.glob("*/best_split.json")
    doc = json.loads(plan.read_text())
    assert doc["model"]["source"] == "hf" and doc["model"]["input_dtype"] == "int64"
    assert doc["measured"]["confirmed"] is True
    proc = subprocess.run([sys.executable, "-m", "pipeline.run", "--split", str(plan), "--repeats", "1",
                           "--no-serial-all"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    assert "output check: max |diff|" in proc.stdout


def test_model_and_factory_together_are_refused(capsys):
    from pipeline.run import main

    assert main(["--model", "hf:gpt2", "--model-factory", "x:y", "--stages", "2", "--policy", "uniform"]) == 2
    assert "both name a model" in capsys.readouterr().err


FAMILIES_EVERYONE_USES = {"gpt2", "llama", "mistral", "qwen2", "gemma", "mixtral", "phi", "gpt_neox", "falcon", "bloom",
                          "gptj", "opt", "blenderbot", "olmo_hybrid"}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:the model's forward cannot run without storage")  # some families: said, and handled
def test_every_causal_lm_family_that_builds_and_runs_is_cut_at_its_blocks():
    """transformers' causal-LM families at tiny sizes: every one that builds and runs on token ids has its
    stacked blocks as candidates (a wrapper never called, Blenderbot's and OPT's decoder-only ``model``, and
    a hybrid stack of mixed layer types included); the rest are named with the reason."""
    from tests.hf_families import causal_lm_types, sweep

    # In this process, one family after another: two spawned interpreters (each importing torch and transformers,
    # their loggers not quieted) took ~64 CPU-s for what this takes in ~47, and make test's other worker has the
    # second core. python -c "from tests.hf_families import main; main()" prints the table.
    table = sweep(causal_lm_types())
    ok = {mt for mt, (v, _) in table.items() if v == "ok"}
    assert FAMILIES_EVERYONE_USES <= ok, {mt: table[mt] for mt in FAMILIES_EVERYONE_USES - ok}
    for mt in ok:
        assert "stacked blocks" in table[mt][1] and not table[mt][1].startswith(("0 ", "1 ")), (mt, table[mt])
    assert all(v in ("ok", "looped", "refused", "does not build", "does not shrink") for v, _ in table.values())
    assert not [mt for mt, (v, d) in table.items() if v == "refused" and "no place to cut" in d]


def test_a_config_the_model_cannot_run_is_named_as_such_and_an_encoder_decoder_points_to_a_factory():
    bad = {**LLAMA, "num_attention_heads": 4, "hidden_size": 32, "num_key_value_heads": 3}
    with pytest.raises(PipesplitError, match=r"hf:llama failed on its own config with --model-kwargs .*num_key_value_heads"
                                             r".*check them against LlamaConfig") as e:
        resolve_spec("hf:llama", kwargs=bad, batch_size=2, seq_len=8)
    assert "--model-factory" not in str(e.value)
    t5 = {"num_layers": 1, "d_model": 32, "d_ff": 64, "num_heads": 2, "d_kv": 16, "vocab_size": 128}
    with pytest.raises(PipesplitError, match=r"hf:t5 is an encoder-decoder.*tests/factories/t5.py"):
        resolve_spec("hf:t5", kwargs=t5, batch_size=2, seq_len=8)
