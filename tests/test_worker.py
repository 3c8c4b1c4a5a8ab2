"""A stage worker whose driver is killed (kill -9) leaves quietly: one line, no traceback, no orphan."""

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

DRIVER = """
import sys
from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.models.build import resolve_spec
from pipeline.ranks.pool import StagePool
from tests.conftest import TINY_VIT
spec = resolve_spec("deit_tiny_patch16_224", kwargs=TINY_VIT, batch_size=8)
plan = SplitPlan(model=spec, split_points=(SplitPoint("blocks.2"),), chunks=2)
with StagePool(2, threads_per_stage=1, quiet=True) as pool:
    print(" ".join(map(str, pool.pids)), flush=True)
    while True:
        pool.run(plan, repeats=5, warmup=0)
"""


def test_workers_of_a_killed_driver_exit_quietly():
    proc = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2
    time.sleep(3)  # mid-trial
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    err = proc.stderr.read()  # EOF once the workers, which share this stderr, are gone too
    for pid in pids:
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"stage worker {pid} outlived its driver")
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert err.count("the driver went away") <= 2
