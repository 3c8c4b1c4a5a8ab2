"""pipeline.ranks.probe: a rank's own memory before its stage, from a process forked as the ranks are."""

import json

from pipeline.models.build import resolve_spec
from pipeline.ranks.pool import start_context
from pipeline.ranks.probe import rank_runtime


def test_the_probe_holds_what_a_rank_holds_before_its_stage_and_is_asked_once(tiny_spec):
    import multiprocessing

    spec_json = json.dumps(tiny_spec.to_dict(), sort_keys=True)
    before = len(multiprocessing.active_children())
    got = rank_runtime(spec_json, "block", "cpu")
    assert start_context().get_start_method() == "forkserver"
    assert 100 * 2**20 < got < 8 * 2**30  # torch and the stage code are in it, and no model's weights
    assert rank_runtime(spec_json, "block", "cpu") == got and rank_runtime.cache_info().hits >= 1
    assert len(multiprocessing.active_children()) == before  # the probe is gone
    assert rank_runtime(spec_json, "block", "cuda") == 0  # on CUDA the peak is what torch allocates


def test_a_model_the_probe_cannot_build_falls_back_to_a_fresh_interpreter(monkeypatch):
    from pipeline.models import footprint

    bad = resolve_spec("deit_tiny_patch16_224", kwargs={"depth": 1, "img_size": 32, "patch_size": 8, "embed_dim": 48,
                                                        "num_heads": 2, "num_classes": 10}, batch_size=2)
    doc = bad.to_dict()
    doc["kwargs"] = {**doc["kwargs"], "embed_dim": 47}  # its heads no longer divide it: the build fails
    asked = []
    monkeypatch.setattr(footprint, "rank_runtime", lambda *a: asked.append(a) or 123)
    assert rank_runtime(json.dumps(doc, sort_keys=True), "block", "cpu") == 123 and len(asked) == 1
