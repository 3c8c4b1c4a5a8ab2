import pytest
import torch

from pipeline.core.errors import PipesplitError
from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.models.batch import example_input
from pipeline.models.build import build_model, resolve_spec
from pipeline.models.candidates import find_candidates

SWIN = {"img_size": 64, "window_size": 2, "depths": (1, 1, 2, 1), "embed_dim": 24, "num_heads": (1, 1, 2, 2)}


def cands(name, granularity="block", **kw):
    spec = resolve_spec(name, batch_size=2, **kw)
    model = build_model(spec)
    return spec, model, find_candidates(model, spec, granularity)


def test_vit_blocks_in_execution_order(tiny_spec):
    c = find_candidates(build_model(tiny_spec), tiny_spec)
    assert c.blocks == ("patch_embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "norm", "head")
    assert c.cuts[0] == "blocks.0"
    assert sum(c.segment_params()) == sum(p.numel() for p in build_model(tiny_spec).parameters())


def test_vit_layer_granularity_cuts_inside_blocks(tiny_spec):
    c = find_candidates(build_model(tiny_spec), tiny_spec, "layer")
    assert "blocks.3.mlp" in c.blocks and "blocks.3.attn" in c.blocks
    assert c.blocks.index("blocks.3.attn") < c.blocks.index("blocks.3.mlp")


def test_resnet_blocks_come_from_its_stages():
    _, _, c = cands("resnet18", image_size=64)
    assert c.blocks == ("conv1", "bn1", "layer1.0", "layer1.1", "layer2.0", "layer2.1",
                        "layer3.0", "layer3.1", "layer4.0", "layer4.1", "fc")


def test_hierarchical_models_expand_stage_blocks():
    _, _, swin = cands("swin_tiny_patch4_window7_224", kwargs=SWIN)
    assert "layers.2.blocks.0" in swin.blocks and "layers.2.blocks.1" in swin.blocks
    _, _, conv = cands("convnext_atto", image_size=64)
    assert "stages.2.blocks.5" in conv.blocks and "stages.1.downsample" in conv.blocks


@pytest.mark.slow
@pytest.mark.parametrize("name, kw", [
    ("deit_tiny_patch16_224", {"kwargs": {"depth": 2, "img_size": 32, "patch_size": 8, "embed_dim": 48}}),
    ("resnet18", {"image_size": 64}),
    ("swin_tiny_patch4_window7_224", {"kwargs": SWIN}),
    ("convnext_atto", {"image_size": 64}),
])
def test_every_candidate_cut_traces_and_matches_the_model(name, kw):
    """Each candidate is a real cut: torch's pipeline() traces it into two stages that compute the model."""
    from torch.distributed.pipelining import SplitPoint as TorchSplitPoint
    from torch.distributed.pipelining import pipeline

    spec, model, c = cands(name, **kw)
    (x,) = example_input(spec)
    with torch.no_grad():
        ref = model(x)
    step = max(1, len(c.cuts) // 4)
    for fqn in c.cuts[::step]:
        pipe = pipeline(build_model(spec), mb_args=(x,), split_spec={fqn: TorchSplitPoint.BEGINNING})
        assert pipe.num_stages == 2, fqn
        with torch.no_grad():
            out = pipe(x)
        out = out[0] if isinstance(out, (tuple, list)) else out
        assert torch.allclose(out, ref, atol=1e-4), fqn


def _plan(spec, *points):
    return SplitPlan(model=spec, split_points=tuple(SplitPoint(*p) if isinstance(p, tuple) else SplitPoint(p)
                                                    for p in points), chunks=1)


def test_validation_against_the_model(tiny_spec):
    c = find_candidates(build_model(tiny_spec), tiny_spec)
    c.validate(_plan(tiny_spec, "blocks.2"))
    c.validate(_plan(tiny_spec, "blocks.0.mlp.fc2"))  # any module called once, not only candidates
    c.validate(_plan(tiny_spec, ("blocks.1", "END"), "blocks.3"))
    for cut in c.cuts:  # every candidate is a valid cut, the last module (head, a leaf) included
        c.validate(_plan(tiny_spec, cut))
    with pytest.raises(PipesplitError, match=r"'blocks.9' is not a module .* calls exactly once \(did you mean"):
        c.validate(_plan(tiny_spec, "blocks.9"))
    with pytest.raises(PipesplitError, match="out of execution order: blocks.1 .* runs before blocks.3"):
        c.validate(_plan(tiny_spec, "blocks.3", "blocks.1"))
    with pytest.raises(PipesplitError, match="stage 1 of the plan would run no module"):
        c.validate(_plan(tiny_spec, ("blocks.1", "END"), "blocks.2"))
    with pytest.raises(PipesplitError, match="stage 0 of the plan would run no module"):
        c.validate(_plan(tiny_spec, "patch_embed"))
    too_many = _plan(tiny_spec, *c.cuts[:6], *["blocks.0.attn", "blocks.1.attn"])
    with pytest.raises(PipesplitError, match="9 stages is too many .* at most 7 stages"):
        c.validate(too_many)


def test_round_trip(tiny_spec):
    from pipeline.models.candidates import Candidates

    c = find_candidates(build_model(tiny_spec), tiny_spec)
    assert Candidates.from_dict(c.to_dict()) == c
