"""pipeline.stage.training: targets, loss, tied parameters and the gradient check; real 2-rank training steps."""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pipeline.core.errors import PipesplitError
from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.models.batch import example_input
from pipeline.models.build import build_model, resolve_spec
from pipeline.stage.orders import schedule_order
from pipeline.stage.training import IGNORE, Reference, aliases, check_grads, loss_fn, make_optimizer, make_target, reference

GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 128, "n_positions": 32}


def test_a_language_model_learns_the_next_token():
    spec = resolve_spec("hf:gpt2", kwargs=GPT2, batch_size=2, seq_len=8)
    x = example_input(spec)
    target = make_target(spec, x, torch.empty(2, 8, 128))
    assert torch.equal(target[:, :-1], x[0][:, 1:]) and (target[:, -1] == IGNORE).all()


def test_a_classifier_gets_fixed_random_classes(tiny_spec):
    x = example_input(tiny_spec)
    a = make_target(tiny_spec, x, torch.empty(8, 10))
    assert a.shape == (8,) and a.dtype == torch.int64 and int(a.max()) < 10
    assert torch.equal(a, make_target(tiny_spec, x, torch.empty(8, 10)))  # the same on every rank


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(2, 6), st.integers(1, 4))
def test_the_mean_of_equal_microbatch_losses_is_the_batch_loss(chunks, classes, per):
    """What lets a pipeline's losses (one per microbatch) be checked against the serial step's one loss."""
    g = torch.Generator().manual_seed(chunks * 100 + classes)
    out = torch.randn(chunks * per, 3, classes, generator=g)
    target = torch.randint(0, classes, (chunks * per, 3), generator=g)
    target[:, -1] = IGNORE
    whole = loss_fn(out, target)
    parts = torch.stack([loss_fn(o, t) for o, t in zip(out.chunk(chunks), target.chunk(chunks))]).mean()
    assert torch.allclose(whole, parts, atol=1e-6)


def test_tied_weights_have_one_first_name():
    model = build_model(resolve_spec("hf:gpt2", kwargs=GPT2, batch_size=2, seq_len=8))
    names = aliases(model)
    assert names["lm_head.weight"] == "transformer.wte.weight" == names["transformer.wte.weight"]


def test_the_gradient_check_names_the_worst_parameter():
    lin = nn.Linear(3, 2)
    ref = Reference(loss=0.0, grads={"weight": torch.ones(2, 3), "bias": torch.ones(2)})
    lin.weight.grad = torch.ones(2, 3)
    lin.bias.grad = torch.full((2,), 1.5)
    worst = check_grads(list(lin.named_parameters()), ref, rtol=1e-3)
    assert worst.name == "bias" and worst.diff == pytest.approx(0.5) and worst.diff > worst.tol
    lin.bias.grad = None  # a stage that computed no gradient for a parameter that has one
    assert check_grads(list(lin.named_parameters()), ref, rtol=1e-3).name == "bias"


def test_the_reference_leaves_the_model_without_gradients(tiny_spec):
    model = build_model(tiny_spec)
    x = example_input(tiny_spec)
    ref = reference(model, x, make_target(tiny_spec, x, torch.empty(8, 10)))
    assert ref.loss > 0 and set(ref.grads) == {n for n, _ in model.named_parameters()}
    assert all(p.grad is None for p in model.parameters())


def test_an_unknown_optimizer_is_one_line():
    with pytest.raises(PipesplitError, match="optimizer 'lamb' is unknown"):
        make_optimizer("lamb", [nn.Parameter(torch.zeros(1))])


@pytest.mark.parametrize("change, message", [
    ({"schedule": "1F1B", "chunks": 1}, "1F1B needs at least as many chunks as stages"),
    ({"mode": "train", "backend": "pippy"}, "training runs on the torch backend"),
    ({"mode": "fit"}, "mode 'fit' is unknown"),
])
def test_plans_that_cannot_train_or_schedule_are_refused_with_the_rule(tiny_spec, change, message):
    with pytest.raises(PipesplitError, match=message):
        SplitPlan(model=tiny_spec, split_points=(SplitPoint("blocks.2"),), **change)


def test_a_training_plan_round_trips_and_names_its_optimizer(tiny_spec):
    plan = SplitPlan(model=tiny_spec, split_points=(SplitPoint("blocks.2"),), chunks=2, mode="train", optimizer="sgd")
    d = plan.to_dict()
    assert (d["mode"], d["optimizer"]) == ("train", "sgd") and SplitPlan.from_dict(d) == plan
    assert "optimizer" not in SplitPlan(model=tiny_spec, split_points=(SplitPoint("blocks.2"),)).to_dict()


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_a_two_rank_training_step_equals_the_serial_step(pool2, tiny_spec, schedule):
    plan = SplitPlan(model=tiny_spec, split_points=(SplitPoint("blocks.2"),), chunks=4, schedule=schedule,
                     mode="train")
    r = pool2.run(plan, repeats=2, warmup=1, serial_all=False)
    assert r.ok, r.reason
    assert r.max_abs_diff <= r.tolerance and len(r.serial_s) == len(r.pipeline_s) == 2
    # the result says what its check covered: the loss and the gradient of every parameter, the worst by name
    names = {n for n, p in build_model(tiny_spec).named_parameters()}
    c = r.check
    assert c is not None and (c.compared, c.gradients) == ("loss and gradients", len(names))
    assert c.worst in names and c.diff <= c.tolerance and c.loss_diff is not None and c.loss_diff <= c.loss_tolerance
    assert all(s > 0 for s in r.serial_s) and all(m > 0 for m in r.peak_mem_bytes)
    assert all(0 < b <= m for b, m in zip(r.base_mem_bytes, r.peak_mem_bytes))


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_strided_view_across_the_cut_trains(pool2, tiny_spec):
    # a ViT's x[:, 0] crosses a cut before head as a view: its gradient comes back into a buffer torch
    # allocates with the traced strides, which gloo refuses unless they are made contiguous
    plan = SplitPlan(model=tiny_spec, split_points=(SplitPoint("head"),), chunks=2, mode="train")
    r = pool2.run(plan, repeats=1, warmup=0, serial_all=False)
    assert r.ok, r.reason
    assert r.max_abs_diff <= r.tolerance


@pytest.mark.slow
@pytest.mark.multiprocess
def test_tied_embeddings_on_two_stages_train_with_summed_gradients(tmp_path, capsys):
    from pipeline.run import main

    out = tmp_path / "train.json"
    assert main(["--model", "hf:gpt2", "--model-kwargs", json.dumps(GPT2), "--seq-len", "8", "--batch-size", "4",
                 "--split-points", "transformer.h.1", "--chunks", "2", "--mode", "train", "--optimizer", "sgd",
                 "--repeats", "1", "--warmup", "0", "--no-serial-all", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["mode"] == "train" and doc["measured"]["max_abs_diff"] <= doc["measured"]["tolerance"]
    check = doc["measured"]["check"]
    # the tied lm_head/wte weight is one parameter on each stage: both copies' gradients are compared
    assert check["compared"] == "loss and gradients" and check["gradients"] >= 2 and check["loss_diff"] is not None
    out = capsys.readouterr().out
    assert f"{check['gradients']} gradients; the worst (relative to its scale) {check['worst']}" in out


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", ["train", "infer"])
def test_two_virtual_stages_per_rank_interleave_and_match_the_unsplit_model(pool2, tiny_spec, mode):
    plan = SplitPlan(model=tiny_spec, split_points=tuple(SplitPoint(f"blocks.{i}") for i in (1, 2, 3)), chunks=4,
                     schedule="Interleaved1F1B", stages_per_rank=2, mode=mode)
    r = pool2.run(plan, repeats=1, warmup=0, serial_all=False)
    assert r.ok, r.reason
    assert r.max_abs_diff <= r.tolerance and len(r.peak_mem_bytes) == 2
    torch_order = schedule_order("Interleaved1F1B", 2, 2, 4, train=mode == "train")
    assert torch_order is not None and r.extra["actions"] == [list(a) for a in torch_order.actions]  # what the model replays


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("schedule", ["ZBVZeroBubble", "DualPipeV"])
def test_a_zero_bubble_v_schedule_trains_with_same_rank_neighbours(pool2, tiny_spec, schedule):
    # rank 1 holds stages 1 and 2: torch's warm-up would send to itself (gloo: "Pair is not connected")
    plan = SplitPlan(model=tiny_spec, split_points=tuple(SplitPoint(f"blocks.{i}") for i in (1, 2, 3)), chunks=4,
                     schedule=schedule, stages_per_rank=2, mode="train")
    r = pool2.run(plan, repeats=1, warmup=0, serial_all=False)
    assert r.ok, r.reason
    assert r.max_abs_diff <= r.tolerance
    assert any("W" in a for a in r.extra["actions"][1])  # weight-grad apart from input-grad
    torch_order = schedule_order(schedule, 2, 2, 4, train=True)
    assert torch_order is not None and r.extra["actions"] == [list(a) for a in torch_order.actions]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_recorded_1f1b_action_order_is_the_textbook_one(pool2, tiny_spec):
    plan = SplitPlan(model=tiny_spec, split_points=(SplitPoint("blocks.2"),), chunks=4, schedule="1F1B", mode="train")
    r = pool2.run(plan, repeats=1, warmup=0, serial_all=False)
    assert r.ok, r.reason
    assert r.extra["actions"] == [["0F0", "0F1", "0B0", "0F2", "0B1", "0F3", "0B2", "0B3"],
                       ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2", "1F3", "1B3"]]
    torch_order = schedule_order("1F1B", 2, 1, 4, train=True)
    assert torch_order is not None and r.extra["actions"] == [list(a) for a in torch_order.actions]
