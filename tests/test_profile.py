"""costmodel.profile on a tiny ViT: segments as the pipeline runs them, the link, the cache."""

import json

import pytest

from costmodel.flops import count_flops
from costmodel.profile import load_or_profile, main
from costmodel.types import Profile
from pipeline.models.batch import example_input
from pipeline.models.build import build_model

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


@pytest.fixture(scope="module")
def cached(tmp_path_factory, tiny_spec):
    root = tmp_path_factory.mktemp("profiles")
    prof, was_cached = load_or_profile(tiny_spec, threads=1, micro_sizes=[2, 8], root=root, repeats=2, quiet=True)
    assert not was_cached
    return root, prof


def test_segments_cover_the_model(cached, tiny_spec):
    _, prof = cached
    assert prof.fqns == ("patch_embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "norm", "head")
    whole = count_flops(build_model(tiny_spec), (example_input(tiny_spec)[0][:1],))
    assert abs(prof.total_flops - whole) / whole < 0.01
    params = sum(p.numel() * 4 for p in build_model(tiny_spec).parameters())
    assert sum(s.param_bytes for s in prof.segments) == params
    tokens = (32 // 8) ** 2 + 1
    assert prof.segments[1].out_bytes == tokens * 48 * 4  # between blocks: the token tensor
    assert prof.segments[-2].out_bytes == 48 * 4  # before the head: the pooled feature
    assert prof.segments[-1].out_bytes == 0
    assert sorted(prof.segments[1].latency_s) == [2, 8]
    assert all(t > 0 for s in prof.segments for t in s.latency_s.values())
    assert prof.link.bandwidth_Bps > 0 and prof.link.latency_s >= 0 and len(prof.link.samples) >= 2


def test_cache_hit_then_reprofile(cached, tiny_spec):
    root, prof = cached
    again, was_cached = load_or_profile(tiny_spec, threads=1, micro_sizes=[2, 8], root=root, quiet=True)
    assert was_cached and again == prof
    other, was_cached = load_or_profile(tiny_spec, threads=1, micro_sizes=[4, 8], root=root, quiet=True, repeats=1)
    assert not was_cached and sorted(other.segments[0].latency_s) == [4, 8]
    assert len(list(root.glob("*.json"))) == 2


def test_json_round_trip_and_cli_table(cached, capsys, tmp_path):
    root, prof = cached
    path = next(root.glob(f"*-{prof.key}.json"))  # the fixture's own profile, not another test's in the same folder
    data = json.loads(path.read_text())
    assert {"total_flops", "segments"} <= set(data)
    assert {"fqn", "flops", "param_bytes", "out_bytes", "latency_s"} <= set(data["segments"][0])
    assert Profile.from_dict(data) == prof
    from tests.conftest import TINY_VIT_ARGS

    out = tmp_path / "p.json"
    assert main([*TINY_VIT_ARGS, "--threads", "1", "--micro-sizes", "2,8", "--cache-dir", str(root),
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "blocks.3" in text and "link (gloo)" in text and "(cached:" in text
    assert json.loads(out.read_text())["total_flops"] == prof.total_flops


def test_concurrent_profile_times_segments_in_stage_workers(tiny_spec, tmp_path):
    """concurrency=2: two stage workers time the segments at once, as a 2-stage pipeline runs them."""
    prof, was_cached = load_or_profile(tiny_spec, threads=1, micro_sizes=[4, 8], root=tmp_path, repeats=1,
                                       concurrency=2, quiet=True)
    assert not was_cached and prof.concurrency == 2
    assert prof.fqns[1] == "blocks.0" and prof.total_flops > 0
    assert all(t > 0 for s in prof.segments for t in s.latency_s.values())
    assert all(lo <= s.latency_s[m] <= hi for s in prof.segments for m, (lo, hi) in s.latency_spread.items())
    assert json.loads(next(tmp_path.glob("*.json")).read_text())["concurrency"] == 2


def test_a_training_profile_keeps_backward_and_optimizer_times_and_its_own_cache_entry(cached, tiny_spec, capsys):
    root, prof = cached
    train, was_cached = load_or_profile(tiny_spec, threads=1, micro_sizes=[2, 8], root=root, repeats=1, quiet=True,
                                        train=True)
    assert not was_cached and train.key != prof.key  # forward-only profiles keep their cache entries
    s = train.segments[1]
    assert set(s.backward_s) == {2, 8} and s.backward_s[8] > 0 and s.optimizer_s is not None and s.saved_bytes > 0
    assert not prof.segments[1].backward_s
    assert Profile.from_dict(json.loads(json.dumps(train.to_dict()))) == train
    from tests.conftest import TINY_VIT_ARGS

    assert main([*TINY_VIT_ARGS, "--threads", "1", "--micro-sizes", "2,8", "--cache-dir", str(root), "--train"]) == 0
    assert "training, at microbatch 8" in capsys.readouterr().out


def test_a_whole_model_over_device_memory_is_profiled_one_segment_at_a_time(tmp_path, capsys):
    from tests.conftest import TINY_VIT_ARGS

    out = tmp_path / "streamed.json"
    assert main([*TINY_VIT_ARGS, "--device-memory", "10MiB", "--cache-dir", str(tmp_path), "--micro-sizes", "8",
                 "--repeats", "1", "--out", str(out)]) == 0
    assert "timing one segment at a time" in capsys.readouterr().err
    streamed = Profile.from_dict(json.loads(out.read_text()))
    whole, _ = load_or_profile(streamed_spec(), micro_sizes=[8], repeats=1, root=tmp_path)
    assert [s.fqn for s in streamed.segments] == [s.fqn for s in whole.segments]
    assert [s.param_bytes for s in streamed.segments] == [s.param_bytes for s in whole.segments]
    assert [s.out_bytes for s in streamed.segments] == [s.out_bytes for s in whole.segments]
    assert all(s.latency_s[8] > 0 for s in streamed.segments)
    # torch's FlopCounterMode on fake tensors vs fvcore, which also counts normalisation layers
    big = max(b.flops for b in whole.segments)
    for a, b in zip(streamed.segments, whole.segments):
        assert abs(a.flops - b.flops) <= 0.1 * big, (a.fqn, a.flops, b.flops)


def streamed_spec():
    from pipeline.models.build import resolve_spec
    from tests.conftest import TINY_VIT

    return resolve_spec("deit_tiny_patch16_224", kwargs=TINY_VIT, batch_size=8)
