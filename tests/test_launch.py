"""torchrun: two agents on 127.0.0.1 (c10d rendezvous, 2 "nodes" of 1 or 2 processes) run real trials and a
plan on a (pp, dp_shard) mesh; the placement helpers on their own."""

import json
import subprocess
import sys

import optuna
import pytest

from pipeline.core.errors import PipesplitError
from pipeline.ranks.launch import RankPool, follower_exit, torchrun_env
from tests.conftest import TINY_VIT_ARGS, free_port

TORCHRUN_ENV = {"TORCHELASTIC_RUN_ID": "t", "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": "1"}


def test_no_torchrun_means_local_workers(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert torchrun_env() is None
    assert follower_exit(None) is None


def test_torchrun_placement_and_a_stage_count_that_does_not_match(monkeypatch):
    for k, v in TORCHRUN_ENV.items():
        monkeypatch.setenv(k, v)
    env = torchrun_env()
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (0, 2, 0, 1)
    with pytest.raises(PipesplitError, match="torchrun started 2 processes but --stages is 4: pass --stages 2"):
        RankPool(4)


def test_a_mesh_that_is_not_torchruns_world_is_one_line(monkeypatch):
    from pipeline.ranks.hosts import check_torchrun_world

    for k, v in TORCHRUN_ENV.items():
        monkeypatch.setenv(k, v)
    check_torchrun_world(2, "--stages 1 x --dp-shard 2")  # two processes, as started
    with pytest.raises(PipesplitError, match=r"torchrun started 2 processes but --stages 2 x --dp-shard 2 runs on 4: "
                                             r"start 4 \(nnodes x nproc-per-node\), or give --stages x --dp-shard = 2"):
        check_torchrun_world(4, "--stages 2 x --dp-shard 2")


def agents(argv, tmp_path, timeout=600, per_node=1):
    """Two torchrun agents, as two nodes would start them, meeting at one c10d rendezvous endpoint."""
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", str(per_node),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "pipesplit-test",
           "--max-restarts", "0", *argv]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
             for _ in range(2)]
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append((p.returncode, out))
    return outs


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_torchrun_agents_run_a_search_trial_and_record_it(tmp_path):
    db = tmp_path / "o.db"
    argv = ["-m", "search.optimize", *TINY_VIT_ARGS, "--stages", "2", "--chunks", "2", "--trials", "1",
            "--repeats", "1", "--confirm-top", "1", "--confirm-rounds", "1", "--threads-per-stage", "1",
            "--no-progress", "--storage", f"sqlite:///{db}", "--study-name", "torchrun", "--results-dir",
            str(tmp_path / "results")]
    outs = agents(argv, tmp_path)
    assert all(code == 0 for code, _ in outs), outs
    study = optuna.load_study(study_name="torchrun", storage=f"sqlite:///{db}")
    measured = [t for t in study.trials if t.user_attrs.get("measured")]
    assert len(measured) == 1 and measured[0].state == optuna.trial.TrialState.COMPLETE
    assert measured[0].user_attrs["output_check"] == "ok" and measured[0].value > 0
    best = json.loads((tmp_path / "results" / "torchrun" / "best_split.json").read_text())
    assert best["stages"] == 2 and best["measured"]["speedup"] > 0


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_plan_on_a_mesh_spans_two_torchrun_nodes_and_bad_input_releases_the_followers(tmp_path):
    out = tmp_path / "r.json"
    llama = ('{"num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2, '
             '"num_key_value_heads": 2, "vocab_size": 256}')
    argv = ["-m", "pipeline.run", "--model", "hf:llama", "--model-kwargs", llama, "--seq-len", "16", "--batch-size",
            "8", "--split-points", "model.layers.2", "--chunks", "2", "--mode", "train", "--dp-shard", "2",
            "--repeats", "1", "--threads-per-stage", "1", "--no-serial-all", "--out", str(out)]
    outs = agents(argv, tmp_path, per_node=2)  # 2 "nodes" x 2 processes: ranks 0, 1 on the first
    assert all(code == 0 for code, _ in outs), outs
    doc = json.loads(out.read_text())
    m = doc["measured"]
    assert m["ok"] and doc["dp_shard"] == 2 and m["check"]["compared"] == "loss and gradients"
    assert doc["split_points"] == [{"fqn": "model.layers.2", "kind": "BEGINNING"}]
    b = m["stage_bytes"]  # pp outermost: node 0's two processes shard stage 0, node 1's stage 1
    assert len(b) == 4 and b[0] == b[1] and b[2] == b[3] and b[0] != b[2]
    # rank 0 refuses the input before any pool exists: it still lets rank 1 go, so both end promptly
    bad = ["-m", "pipeline.run", *TINY_VIT_ARGS, "--split-points", "nope.1", "--threads-per-stage", "1"]
    outs = agents(bad, tmp_path, timeout=180)  # without the release, the follower's agent waits 300 s
    text = "".join(o for _, o in outs)
    assert "error: split point 'nope.1' is not a module" in text
    assert all(code != 0 for code, _ in outs)
    root = __import__("pathlib").Path(__file__).parents[1]
    for pkg in ("pipeline", "search"):  # torchrun prints its own ChildFailedError; pipesplit prints one line
        assert f'File "{root / pkg}' not in text



