"""search.optimize end to end on a tiny model: real trials, real SQLite, resume, re-run, dashboard."""

import json
import subprocess
import sys
import urllib.request

import pytest

from search.optimize import main
from tests.conftest import TINY_VIT_ARGS, dashboard

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

STUDY = "tiny-e2e"


def run_args(tmp, trials):
    return [*TINY_VIT_ARGS, "--stages", "2", "--chunks", "1,2,4", "--trials", str(trials), "--repeats", "1",
            "--min-trial-seconds", "0", "--confirm-top", "2", "--confirm-rounds", "1", "--threads-per-stage", "1",
            "--no-progress", "--storage", f"sqlite:///{tmp}/optuna.db", "--study-name", STUDY, "--results-dir", str(tmp),
            "--seed", "1"]


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("search")
    assert main([*run_args(tmp, 5), "--export-to", "all"]) == 0
    return tmp


def test_search_exports_a_confirmed_best_split(searched):
    doc = json.loads((searched / STUDY / "best_split.json").read_text())
    assert doc["stages"] == 2 and len(doc["split_points"]) == 1
    assert doc["measured"]["confirmed"] is True and doc["measured"]["speedup"] > 0
    assert doc["provenance"]["study"] == STUDY
    csv = (searched / STUDY / "trials.csv").read_text()
    assert "user_attrs_source" in csv and "pippy-equal-size" in csv
    summary = (searched / STUDY / "summary.md").read_text()
    assert "| BEST |" in summary and "pippy-equal-size" in summary


def test_the_best_split_is_written_for_each_framework_as_pipeline_export_prints_it(searched, capsys):
    from pipeline.export import main as export_main

    best = searched / STUDY / "best_split.json"
    for fmt, key in (("torchtitan", "module_fqns_per_model_part = [["), ("megatron", "--pipeline-model-parallel-layout"),
                     ("deepspeed", "parts = [0, ")):
        text = (searched / STUDY / f"best_split.{fmt}.txt").read_text()
        assert text.startswith(f"# pipesplit's split for {fmt}: 2 stages") and key in text
        assert export_main(["--split", str(best), "--to", fmt]) == 0
        assert capsys.readouterr().out == text
    summary = (searched / STUDY / "summary.md").read_text()
    assert "Against the frameworks' default rules" in summary or "Frameworks' rules not measured" in summary


def test_the_study_holds_the_seeds_and_measured_trials(searched):
    import optuna

    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{searched}/optuna.db")
    measured = [t for t in study.trials if t.user_attrs.get("measured")]
    assert len(measured) == 5
    sources = {t.user_attrs["source"] for t in measured}
    assert "pippy-equal-size" in sources and any("costmodel-optimum" in s for s in sources)
    ok = [t for t in measured if t.state == optuna.trial.TrialState.COMPLETE]
    assert all(t.user_attrs["output_check"] == "ok" and t.user_attrs["split_points"] for t in ok)
    assert study.user_attrs["confirmation"]["best_trial"] is not None


def test_best_split_runs_again_with_pipeline_run(searched):
    proc = subprocess.run([sys.executable, "-m", "pipeline.run", "--split", str(searched / STUDY / "best_split.json"),
                           "--repeats", "1", "--no-serial-all"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr  # a failed trial's reason is on stdout
    assert "speedup" in proc.stdout


def test_resume_adds_trials_to_the_same_study(searched):
    import optuna

    assert main(run_args(searched, 7)) == 0
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{searched}/optuna.db")
    assert len([t for t in study.trials if t.user_attrs.get("measured")]) == 7
    assert len(optuna.get_all_study_summaries(f"sqlite:///{searched}/optuna.db")) == 1


def test_dashboard_lists_the_study_and_its_trials(searched):
    with dashboard(f"sqlite:///{searched}/optuna.db") as base:
        studies = json.load(urllib.request.urlopen(f"{base}/api/studies", timeout=10))
        study = next(s for s in studies["study_summaries"] if s["study_name"] == STUDY)
        detail = json.load(urllib.request.urlopen(f"{base}/api/studies/{study['study_id']}", timeout=10))
        trials = detail["trials"]
        assert len(trials) >= 5
        keys = {a["key"] for t in trials for a in t["user_attrs"]}
        assert {"source", "split_points", "chunks", "measured"} <= keys


@pytest.mark.parametrize("extra, message", [
    (["--model", "no_such_net"], "unknown timm model"),
    (["--stages", "40"], "--stages 40 is too many"),
    (["--chunks", "3,5"], "none of --chunks 3,5 divides batch size 8"),
    (["--chunks", "a,b"], "must be comma-separated integers"),
    (["--storage", "sqlite:////proc/no/such/dir/optuna.db"], "storage sqlite:////proc/no/such/dir/optuna.db"),
    (["--storage", "mysql+nodriver://x@127.0.0.1:1/db"], "storage mysql+nodriver"),
    (["--storage", "not-a-url"], "is neither a database URL"),
    (["--schedule", "GPipe,Zigzag"], "names Zigzag"),
    (["--schedule", "ZBVZeroBubble"], "ZBVZeroBubble trains only"),
    (["--stages-per-rank", "two"], "--stages-per-rank 'two' is not a list of integers"),
    (["--max-stage-memory", "lots"], "--device-memory 'lots' is not a positive size"),
    (["--device-memory", "lots"], "--device-memory 'lots' is not a positive size"),
    (["--device-memory", "1MiB"], "into 2 stages fits --device-memory 1 MiB: the leanest one's rank"),
    (["--max-stage-memory", "1MiB", "--mode", "train"], "a larger --device-memory: the runtime alone is about"),
    (["--objective", "fastest"], "argument --objective: invalid choice"),
    (["--export-to", "torchtitan,titan"], "--export-to titan is not a format pipesplit writes"),
    (["--objectives", "speedup,latency"], "--objectives speedup,latency is not one this search knows"),
    (["--objective", "throughput", "--objectives", "speedup"], "--objective throughput and --objectives speedup disagree"),
])
def test_bad_input_exits_non_zero_with_one_line(tmp_path, capsys, extra, message):
    args = [*TINY_VIT_ARGS, "--stages", "2", "--storage", f"sqlite:///{tmp_path}/o.db", "--results-dir",
            str(tmp_path), "--no-progress", *extra]
    try:
        code = main(args)
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_bad_input_from_the_command_line_is_one_line_and_exit_2(tmp_path):
    args = [*TINY_VIT_ARGS, "--stages", "40", "--storage", f"sqlite:///{tmp_path}/o.db", "--results-dir",
            str(tmp_path), "--no-progress"]
    proc = subprocess.run([sys.executable, "-m", "search.optimize", *args], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "--stages 40 is too many" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_a_search_asked_for_more_plans_than_the_space_holds_says_so(tmp_path, capsys):
    """40 trials asked of a space of a handful of plans: every plan is tried once, and the summary says
    how many the space holds."""
    import optuna

    args = [*TINY_VIT_ARGS, "--stages", "2", "--chunks", "1", "--trials", "40", "--repeats", "1",
            "--min-trial-seconds", "0", "--confirm-top", "1", "--confirm-rounds", "1", "--threads-per-stage", "1",
            "--no-progress", "--no-artifacts", "--no-prune", "--storage", f"sqlite:///{tmp_path}/o.db",
            "--results-dir", str(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    summary = next(tmp_path.glob("*/summary.md")).read_text()
    for text in (out, summary):
        assert "of 40 asked for" in text and "The space holds only" in text
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path}/o.db")
    keys = [t.user_attrs.get("plan_key") for t in study.trials if t.user_attrs.get("measured")]
    assert len(keys) == len(set(keys))  # no plan measured twice


def test_a_four_stage_search_stores_no_infeasible_trial_and_races_its_repeats(tmp_path):
    import optuna
    from optuna_dashboard._note import get_note_from_system_attrs

    args = [*TINY_VIT_ARGS, "--stages", "4", "--chunks", "2,4", "--trials", "5", "--repeats", "2",
            "--min-trial-seconds", "0", "--confirm-top", "1", "--confirm-rounds", "1", "--threads-per-stage", "1",
            "--no-progress", "--no-artifacts", "--granularity", "layer", "--storage", f"sqlite:///{tmp_path}/o.db",
            "--results-dir", str(tmp_path)]
    assert main(args) == 0
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path}/o.db")
    assert study.metric_names == ["speedup"]
    assert not [t for t in study.trials if t.user_attrs.get("infeasible")]
    measured = [t for t in study.trials if t.user_attrs.get("measured")]
    assert len(measured) == 5
    sources = {s for t in measured for s in t.user_attrs["source"].split("+")}
    assert {"torchtitan", "megatron", "deepspeed-parameters"} & sources  # the frameworks' rules at layer granularity
    assert all(p.startswith(("blocks", "patch", "cls", "pos", "norm", "head"))
               for t in measured for p in t.user_attrs["split_points"])
    for t in measured:
        assert t.intermediate_values and max(t.intermediate_values) == t.user_attrs["repeats"]
        note = get_note_from_system_attrs(study._storage.get_study_system_attrs(study._study_id), t._trial_id)["body"]
        assert f"Trial {t.number}" in note and "measured (median of" in note


def test_a_search_over_schedules_prices_each_layout_by_its_own_action_order(tmp_path):
    import optuna

    from pipeline.core.plan import SplitPlan

    args = [*TINY_VIT_ARGS, "--stages", "2", "--chunks", "2,4", "--trials", "6", "--repeats", "1",
            "--min-trial-seconds", "0", "--confirm-top", "1", "--confirm-rounds", "1", "--threads-per-stage", "1",
            "--no-progress", "--no-artifacts", "--schedule", "GPipe,Interleaved1F1B", "--no-prune", "--storage",
            f"sqlite:///{tmp_path}/o.db", "--results-dir", str(tmp_path)]
    assert main(args) == 0
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path}/o.db")
    measured = [t for t in study.trials if t.user_attrs.get("measured")]
    assert {t.user_attrs["schedule"] for t in measured} == {"GPipe", "Interleaved1F1B"}
    assert len(measured) == 6 and [t for t in measured if t.user_attrs["source"] == "sampler"]  # 4 seeds, 2 proposals
    v2 = [t for t in measured if t.user_attrs["stages_per_rank"] == 2]
    assert v2 and all(t.params["layout"] == "Interleaved1F1B/V2" and len(t.user_attrs["split_points"]) == 3
                      and t.user_attrs["predicted_by"] == "replay" and t.user_attrs["predicted_speedup"] > 0
                      for t in v2)
    assert {t.user_attrs.get("predicted_by") for t in measured if t.user_attrs["stages_per_rank"] == 1} <= {"simulate", None}
    assert "costmodel-optimum@Interleaved1F1B/V2" in {t.user_attrs["source"] for t in study.trials}
    assert all(t.state != optuna.trial.TrialState.FAIL for t in v2), [t.user_attrs.get("fail_reason") for t in v2]
    best = SplitPlan.load(next(tmp_path.glob("*/best_split.json")))
    assert best.schedule in ("GPipe", "Interleaved1F1B")
    assert "Interleaved1F1B/V2" in next(tmp_path.glob("*/summary.md")).read_text()


BIG_LLAMA = {"num_hidden_layers": 6, "hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 4,
             "num_key_value_heads": 4, "vocab_size": 8000}
"""430 MiB of fp32 weights in 6 blocks of 64 MiB: the whole model (about 450 MiB besides the runtime) is over a
budget of the runtime + 400 MiB, the leanest 2-stage plan (about 230 MiB) fits it, and a plan cut after the first
block (stage 2: about 420 MiB) does not."""


def test_a_model_over_the_device_memory_is_searched_by_throughput_and_a_plan_over_it_never_runs(tmp_path, capsys):
    import json

    import optuna

    from pipeline.models.build import resolve_spec
    from pipeline.ranks.probe import rank_runtime

    spec = resolve_spec("hf:llama", kwargs=BIG_LLAMA, batch_size=4, seq_len=16)
    budget = rank_runtime(json.dumps(spec.to_dict(), sort_keys=True), "block", "cpu") + 400 * 2**20
    args = ["--model", "hf:llama", "--model-kwargs", json.dumps(BIG_LLAMA), "--batch-size", "4", "--seq-len", "16",
            "--stages", "2", "--chunks", "2", "--trials", "2", "--repeats", "1", "--min-trial-seconds", "0",
            "--confirm-top", "1", "--confirm-rounds", "1", "--threads-per-stage", "1", "--no-progress",
            "--no-artifacts", "--no-prune", "--device-memory", str(budget), "--storage", f"sqlite:///{tmp_path}/o.db",
            "--results-dir", str(tmp_path)]
    # a plan the sampler never proposes (its stage 2 holds five blocks and the head), enqueued by hand first
    study = optuna.create_study(study_name="big", storage=f"sqlite:///{tmp_path}/o.db", direction="maximize")
    study.enqueue_trial({"cut_1": "model.layers.0", "chunks": 2}, user_attrs={"source": "by hand"})
    assert main([*args, "--study-name", "big"]) == 0
    out = capsys.readouterr().out
    assert study.metric_names == ["throughput_samples_per_s"]
    assert study.user_attrs["config"]["objective"] == "throughput" and "streamed" in out
    unrun = [t for t in study.trials if str(t.user_attrs.get("over_memory", "")).startswith("predicted")]
    seen = [(t.number, t.user_attrs.get("source"), t.user_attrs.get("predicted_rank_bytes"),
             t.user_attrs.get("peak_mem_bytes"), t.user_attrs.get("predicted_runtime")) for t in study.trials]
    # first predicted (from the probe's runtime, as the budget was set) and never run; a seed may follow it
    # once the ranks' measured runtime is learned
    assert unrun and unrun[0].user_attrs["source"] == "by hand", (budget, seen)
    assert all("repeats" not in t.user_attrs and not t.user_attrs.get("measured") and
               max(t.user_attrs["predicted_rank_bytes"]) > budget for t in unrun)
    measured = [t for t in study.trials if t.user_attrs.get("measured")]
    assert measured and all("speedup" not in t.user_attrs and t.user_attrs["throughput"] > 0 for t in measured)
    for t in measured:  # a measured plan over the budget is infeasible, never complete
        over = max(t.user_attrs["peak_mem_bytes"]) > budget
        assert (t.state == optuna.trial.TrialState.PRUNED) == over and bool(t.user_attrs.get("over_memory")) == over
        assert len(t.user_attrs["predicted_rank_bytes"]) == 2 and t.values is None or t.values[0] > 0
    summary = next(tmp_path.glob("*/summary.md")).read_text()
    assert "ranked by throughput" in summary and "predicted MiB per stage" in summary
    assert "Predicted / measured peak per rank" in summary
    best = list(tmp_path.glob("*/best_split.json"))
    if best:
        doc = json.loads(best[0].read_text())
        assert doc["measured"]["objective"] == "throughput" and doc["measured"]["throughput"] > 0


def test_a_two_objective_study_keeps_speedup_and_peak_memory_and_lists_its_pareto_front(tmp_path, capsys):
    import optuna

    args = [*TINY_VIT_ARGS, "--stages", "2", "--chunks", "2,4", "--trials", "3", "--repeats", "1",
            "--min-trial-seconds", "0", "--confirm-top", "1", "--confirm-rounds", "1", "--threads-per-stage", "1",
            "--no-progress", "--no-artifacts", "--objectives", "speedup,memory", "--storage",
            f"sqlite:///{tmp_path}/o.db", "--results-dir", str(tmp_path)]
    assert main(args) == 0
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path}/o.db")
    assert study.metric_names == ["speedup", "peak_memory_MiB"] and len(study.directions) == 2
    done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert done and all(t.values[1] == pytest.approx(max(t.user_attrs["peak_mem_bytes"]) / 2**20) for t in done)
    assert "Pareto front" in capsys.readouterr().out
    assert next(tmp_path.glob("*/best_split.json")).exists()


def test_the_same_plan_measured_twice_is_named_a_tie(tmp_path, capsys):
    import optuna

    from pipeline.core.plan import SplitPlan, SplitPoint
    from pipeline.models.build import resolve_spec
    from tests.conftest import TINY_VIT

    storage = f"sqlite:///{tmp_path}/o.db"
    spec = resolve_spec("deit_tiny_patch16_224", kwargs=TINY_VIT, batch_size=8)
    study = optuna.create_study(study_name="twice", storage=storage)
    # one plan spelt two ways (a cut before blocks.2, a cut after blocks.1): the same stages, measured twice
    for source, point in (("by-hand-begin", SplitPoint("blocks.2")), ("by-hand-end", SplitPoint("blocks.1", "END"))):
        plan = SplitPlan(model=spec, split_points=(point,), chunks=2, threads_per_stage=1)
        study.enqueue_trial({}, user_attrs={"source": source, "fixed_plan": plan.to_dict()})
    args = [*TINY_VIT_ARGS, "--stages", "2", "--chunks", "2", "--trials", "2", "--repeats", "1", "--min-trial-seconds",
            "0", "--confirm-rounds", "1", "--threads-per-stage", "1", "--no-progress", "--storage", storage,
            "--study-name", "twice", "--results-dir", str(tmp_path)]
    assert main(args) == 0
    summary = (tmp_path / "twice" / "summary.md").read_text()
    assert "| BEST | by-hand-" in summary and "| TIED | by-hand-" in summary
    # one round of one repeat gives 1 pair: no extra round can reach the rule's 6, so none is run, and that is said
    assert "Tied: trials 0, 1 cannot be separated (paired pipeline seconds" in summary and "tie broken in favour of" in summary
    assert "1 pair of runs separates no two plans (the rule needs 6)" in summary
    doc = json.loads((tmp_path / "twice" / "best_split.json").read_text())
    (other,) = doc["tied_with"]
    assert {other["source"], doc["provenance"]["source"]} == {"by-hand-begin", "by-hand-end"} and doc["tie_reason"]
    note = optuna.load_study(study_name="twice", storage=storage).user_attrs
    assert note["confirmation"]["tied_with"] == [other["trial"]]
