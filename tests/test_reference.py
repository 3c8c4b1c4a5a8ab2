"""pipeline.stage.reference: the streamed reference equals the whole model's output, loss and gradients."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_VIT
from torch._subclasses.fake_tensor import is_fake

from pipeline.models.batch import example_input, first_chunk
from pipeline.models.build import build_meta_model, build_model, resolve_spec
from pipeline.models.fake import fake_copies_allowed, fake_model, module_copy
from pipeline.stage.build import name_in
from pipeline.stage.reference import streamed_output, streamed_step
from pipeline.stage.training import aliases, make_target, reference

GPT2 = {"n_layer": 3, "n_embd": 32, "n_head": 2, "vocab_size": 128, "n_positions": 32}
LLAMA = {"num_hidden_layers": 3, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2,
         "num_key_value_heads": 1, "vocab_size": 128}
CASES = [
    ("deit_tiny_patch16_224", TINY_VIT, {}, ["blocks.1", "blocks.3"]),
    ("hf:gpt2", GPT2, {"seq_len": 8}, ["transformer.h.1", "transformer.h.2"]),  # tied across the first and last
    ("hf:llama", LLAMA, {"seq_len": 8}, ["model.layers.1"]),  # rotary values and a mask cross the cut
]


def _split(spec, meta, cuts, chunks):
    from torch.distributed.pipelining import SplitPoint, pipeline

    x = example_input(spec)
    fake = fake_model(meta, torch.device("cpu"))
    with fake_copies_allowed():
        pipe = pipeline(module_copy(fake.module), mb_args=fake.inputs(first_chunk(x, chunks)),
                        split_spec={c: SplitPoint.BEGINNING for c in cuts})
    return pipe.split_gm, x


@pytest.mark.slow
@pytest.mark.parametrize("name, kwargs, extra, cuts", CASES)
def test_streamed_output_equals_the_whole_models(name, kwargs, extra, cuts):
    spec = resolve_spec(name, kwargs=kwargs, batch_size=4, **extra)
    meta = build_meta_model(spec)
    split_gm, x = _split(spec, meta, cuts, chunks=2)
    got = streamed_output(split_gm, meta, x, 2, torch.device("cpu"), name_in(meta))
    with torch.no_grad():
        want = build_model(spec)(*x)
    assert got.shape == want.shape
    assert float((got - want).abs().max()) <= 1e-4 * max(1.0, float(want.abs().max()))
    assert all(is_fake(p) or p.is_meta for p in split_gm.parameters())  # the split holds no storage


@pytest.mark.slow
@pytest.mark.parametrize("name, kwargs, extra, cuts", CASES)
def test_streamed_training_step_equals_the_whole_models(name, kwargs, extra, cuts):
    spec = resolve_spec(name, kwargs=kwargs, batch_size=4, **extra)
    meta = build_meta_model(spec)
    split_gm, x = _split(spec, meta, cuts, chunks=2)
    model = build_model(spec)
    with torch.no_grad():
        out = model(*x)
    target = make_target(spec, x, out)
    want = reference(model, x, target)
    names = set(want.grads)
    got = streamed_step(split_gm, meta, x, target, 2, torch.device("cpu"), names, name_in(meta))
    assert abs(got.loss - want.loss) <= 1e-4 * max(1.0, abs(want.loss))
    assert set(got.grads) == names == set(aliases(model).values())
    for n in names:
        w = want.grads[n]
        assert float((got.grads[n] - w).abs().max()) <= 1e-3 * float(w.abs().max()) + 1e-6, n


def test_only_the_wanted_gradients_are_kept():
    spec = resolve_spec("deit_tiny_patch16_224", kwargs=TINY_VIT, batch_size=4)
    meta = build_meta_model(spec)
    split_gm, x = _split(spec, meta, ["blocks.2"], chunks=2)
    target = torch.randint(0, 10, (4,))
    got = streamed_step(split_gm, meta, x, target, 2, torch.device("cpu"), {"head.weight", "patch_embed.proj.weight"},
                        name_in(meta))
    assert set(got.grads) == {"head.weight", "patch_embed.proj.weight"}


def test_a_released_stage_is_freed_at_once_and_collected_only_where_a_cycle_still_holds_it(monkeypatch):
    """A full collection costs 0.1-0.4 s in a worker: ``release`` runs one only where a dropped weight
    outlived the drop (a cycle refers to it), and the weight is gone either way."""
    import gc

    from torch.multiprocessing.reductions import StorageWeakRef

    from pipeline.stage import reference

    monkeypatch.setattr(reference, "GC_BYTES", 1)
    collections: list[int] = []

    def seen(phase, info):
        if phase == "start":
            collections.append(info["generation"])

    was_enabled = gc.isenabled()
    gc.disable()  # no automatic collection between the two cases
    gc.callbacks.append(seen)
    try:
        plain = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
        weak = [StorageWeakRef(p.untyped_storage()) for p in plain.parameters()]
        reference.release(plain)
        assert all(w.expired() for w in weak) and collections == []

        held = torch.nn.Linear(16, 16)
        weak = [StorageWeakRef(p.untyped_storage()) for p in held.parameters()]
        cycle: list = [held.weight]
        cycle.append(cycle)
        del cycle
        reference.release(held)
        assert all(w.expired() for w in weak) and collections == [2]
    finally:
        gc.callbacks.remove(seen)
        if was_enabled:
            gc.enable()
