"""Stage builders' helpers that need no process group (the built stages run in test_pool and test_trial)."""

import copy

import torch

from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.models import build_model, example_input
from pipeline.stages import _contiguous_inputs, _fresh_with_cuts


def test_the_model_is_never_modified_and_cut_inputs_are_made_contiguous(tiny_spec):
    model = build_model(tiny_spec)
    before = copy.deepcopy(model.state_dict())
    plan = SplitPlan(model=tiny_spec, split_points=(SplitPoint("head"),), chunks=2)
    fresh = _fresh_with_cuts(model, plan)
    assert fresh is not model and not model.head._forward_pre_hooks and fresh.head._forward_pre_hooks
    x = example_input(tiny_spec)
    assert torch.equal(fresh(x), model(x))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    args, kwargs = _contiguous_inputs(model.head, (torch.zeros(4, 3).t(),), {})
    assert args[0].is_contiguous() and kwargs == {}
