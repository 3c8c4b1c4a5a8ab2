"""Stage builders' helpers that need no process group (the built stages run in test_pool and test_trial)."""

import torch
from torch.distributed.pipelining import SplitPoint as TorchSplitPoint
from torch.distributed.pipelining import pipeline

from pipeline.models.batch import example_input
from pipeline.models.build import build_model
from pipeline.stage.build import _fresh
from pipeline.stage.patches import contiguous_receives


def test_a_strided_value_crossing_a_cut_gets_a_contiguous_receive_buffer(tiny_spec):
    """A cut before a ViT head sends ``x[:, 0]``: traced as a strided view, received into a contiguous buffer."""
    model = build_model(tiny_spec)
    x = example_input(tiny_spec)[0][:2]
    pipe = pipeline(_fresh(model), mb_args=(x,), split_spec={"head": TorchSplitPoint.BEGINNING})
    second = list(pipe.split_gm.children())[1]
    placeholders = [n for n in second.graph.nodes if n.op == "placeholder"]
    assert not all(n.meta["val"].is_contiguous() for n in placeholders)
    assert contiguous_receives(pipe.split_gm) >= 1
    assert all(n.meta["val"].is_contiguous() for n in placeholders)
    assert contiguous_receives(pipe.split_gm) == 0  # already done
    assert torch.equal(_fresh(model)(x), model(x))  # a private copy runs as the model does
