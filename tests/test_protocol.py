"""Commands carry their code; a command that raises on a rank is a fatal reply with its reason."""

import pickle

from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.ranks.protocol import MeasureLink, RunTrial, handle
from pipeline.stage.messages import ErrorReply, TrialOptions
from pipeline.stage.rank import RankState, WorkerConfig


def test_commands_pickle(tiny_spec):
    cmd = RunTrial(plan=SplitPlan(model=tiny_spec, split_points=(SplitPoint("blocks.2"),), chunks=2),
                   options=TrialOptions(repeats=1))
    assert pickle.loads(pickle.dumps(cmd)) == cmd


def test_a_command_that_raises_is_a_fatal_reply():
    state = RankState(1, WorkerConfig(world_size=2, device="cpu", init_method="tcp://127.0.0.1:1", timeout_s=1))
    reply = handle(state, MeasureLink(sizes=(4,), repeats=1))  # no process group here: the probe raises
    assert isinstance(reply, ErrorReply) and reply.fatal and reply.rank == 1
    assert reply.error.startswith("rank 1 could not measure the link: ") and "\n" not in reply.error
