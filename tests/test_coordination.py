"""Several search workers on one study: a journal file and a real PostgreSQL server on loopback. The
study ends with exactly --trials measured trials and no plan measured twice; stale trials are failed."""

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile

import optuna
import pytest

from tests.conftest import TINY_VIT_ARGS, free_port

TRIALS = 6


def workers(storage, tmp_path, n=2):
    argv = [sys.executable, "-m", "search.optimize", *TINY_VIT_ARGS, "--stages", "2", "--chunks", "1,2,4",
            "--trials", str(TRIALS), "--repeats", "1", "--min-trial-seconds", "0", "--confirm-top", "1", "--confirm-rounds", "1",
            "--threads-per-stage", "1", "--no-progress", "--no-prune", "--storage", storage,
            "--study-name", "shared", "--results-dir", str(tmp_path), "--seed", "3"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(n)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    return outs


def check_study(storage):
    from search.trials.coordination import measured_trials

    study = optuna.load_study(study_name="shared", storage=storage)
    measured = measured_trials(study)  # complete, failed with a reason, or raced out
    assert len(measured) == TRIALS, [(t.number, t.state, t.user_attrs.get("worker")) for t in study.trials]
    keys = [t.user_attrs["plan_key"] for t in measured]
    assert len(set(keys)) == len(keys), "a plan was measured twice"
    assert len({t.user_attrs["worker"] for t in measured}) == 2, "both workers should have measured trials"
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    from search.trials.coordination import timed_share

    assert 0 < (timed_share(study) or 0) < 1


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_workers_on_one_journal_file(tmp_path):
    storage = str(tmp_path / "study.log")
    workers(storage, tmp_path)
    from search.trials.storage import open_storage

    check_study(open_storage(storage))


def _pg_bin():
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.path.exists(f"{d}/initdb") and os.path.exists(f"{d}/pg_ctl"):
            return d
    return None


def _install_postgres() -> str:
    if _pg_bin() is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "install", "-y", "-q", "postgresql"], env=env, capture_output=True, timeout=900)
    return _pg_bin()


@pytest.fixture(scope="module")
def postgres():
    """A throwaway PostgreSQL server on 127.0.0.1 (Debian's package, installed here if missing and root)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg (PostgreSQL driver) is missing: make test installs it (pip install -e '.[dev]')")
    bindir = _install_postgres()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed and could not be installed here (apt-get install postgresql "
                    "needs root and a Debian package mirror)")
    root = os.geteuid() == 0
    as_pg = ["runuser", "-u", "postgres", "--"] if root else []
    base = tempfile.mkdtemp(prefix="pipesplit-pg-")
    if root:
        shutil.chown(base, "postgres")
    data, port = f"{base}/data", free_port()
    subprocess.run([*as_pg, f"{bindir}/initdb", "-D", data, "-U", "pipesplit", "--auth=trust"], check=True,
                   capture_output=True, timeout=120)
    subprocess.run([*as_pg, f"{bindir}/pg_ctl", "-D", data, "-l", f"{base}/log", "-w", "-o",
                    f"-p {port} -k {base} -c listen_addresses=127.0.0.1", "start"], check=True, capture_output=True,
                   timeout=120)
    try:
        yield f"postgresql://pipesplit@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_pg, f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "stop"], capture_output=True,
                       timeout=60)
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_workers_on_one_postgres_study(postgres, tmp_path):
    workers(postgres, tmp_path)
    check_study(postgres)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_dead_workers_running_trial_is_failed_as_stale_and_not_counted(tmp_path):
    """A trial left RUNNING by a worker that died (journal storage has no heartbeats) is failed by the next
    worker on the same host, and the budget is then met by measuring another plan."""
    from search.trials.coordination import claims, fail_stale, measured_trials
    from search.trials.storage import open_storage

    storage = open_storage(str(tmp_path / "s.log"))
    study = optuna.create_study(study_name="stale", storage=storage, direction="maximize")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    t = study.ask()
    t.set_user_attr("measured", True)
    t.set_user_attr("plan_key", "x")
    t.set_user_attr("worker", f"{socket.gethostname()}:{dead.pid}")
    assert [x.number for x in claims(study)] == [t.number]
    assert fail_stale(study) == [t.number]
    frozen = study.trials[t.number]
    assert frozen.state == optuna.trial.TrialState.FAIL and "died while measuring" in frozen.user_attrs["stale"]
    assert claims(study) == [] and measured_trials(study) == []


@pytest.mark.parametrize("state", ["complete", "raced", "pruned"])
def test_raced_out_trials_count_as_measured_and_their_repeats_are_spent(state):
    from search.trials.coordination import is_seed, measured_trials, repeats_spent

    study = optuna.create_study(direction="maximize")
    t = study.ask()
    t.set_user_attr("source", "sampler")
    t.set_user_attr("repeats", 3)
    if state == "pruned":  # pruned by the cost model: never ran
        t.set_user_attr("pruned_by", "cost model")
        study.tell(t, state=optuna.trial.TrialState.PRUNED)
    else:
        t.set_user_attr("measured", True)
        if state == "raced":
            t.set_user_attr("raced_out", "after 1 repeat")
            t.report(1.2, step=1)
            study.tell(t, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(t, 1.5)
    assert len(measured_trials(study)) == (0 if state == "pruned" else 1)
    assert repeats_spent(study) == (0 if state == "pruned" else 3)
    assert not is_seed(study.trials[0])


def test_the_share_of_time_spent_timing_sums_the_measured_trials_breakdowns():
    from search.trials.coordination import MEASURED, timed_share

    study = optuna.create_study(direction="maximize")
    assert timed_share(study) is None
    for timed, fixed in ((6.0, 4.0), (9.0, 1.0)):
        t = study.ask()
        t.set_user_attr(MEASURED, True)
        t.set_user_attr("breakdown", {"build_s": fixed, "check_s": 0.0, "warmup_s": 0.0, "timed_s": timed,
                                      "other_s": 0.0, "driver_s": 0.0})
        study.tell(t, 1.0)
    t = study.ask()  # pruned by the cost model: no run, no breakdown, not counted
    study.tell(t, state=optuna.trial.TrialState.PRUNED)
    assert timed_share(study) == pytest.approx(15.0 / 20.0)


def test_a_worker_backs_off_a_plan_another_finished_between_its_duplicate_check_and_its_claim():
    from optuna.trial import TrialState, create_trial

    from search.trials.coordination import MEASURED, skip_reason

    study = optuna.create_study()
    done = create_trial(state=TrialState.COMPLETE, value=1.0,
                        user_attrs={MEASURED: True, "plan_key": "p", "worker": "host:1"})
    study.add_trial(done)
    mine = study.ask()  # this worker's claim of the same plan, still running
    mine.set_user_attr(MEASURED, True)
    mine.set_user_attr("plan_key", "p")
    assert skip_reason(study, mine.number, "p", budget=6) == "the same plan is measured by trial 0"
    assert skip_reason(study, mine.number, "q", budget=6) is None
    assert skip_reason(study, mine.number, "p", budget=None) is None  # one worker: its own duplicate check holds
