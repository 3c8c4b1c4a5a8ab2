"""pipeline.stage.refstore: a study's reference on disk, read back only when every byte is as written."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.stage.refstore import StoredReference, crc, load, reference_key, save

KEY = reference_key('{"model":"tiny"}', "step", "cpu")


def _ref() -> StoredReference:
    g = torch.Generator().manual_seed(0)
    return StoredReference(tensors={"a.weight": torch.randn(4, 3, generator=g),
                                    "b.bias": torch.randn(5, generator=g).to(torch.bfloat16)}, loss=1.25)


def _files(folder):
    (data,) = folder.glob("*.pt")
    (manifest,) = folder.glob("*.json")
    return data, manifest


def test_a_saved_reference_reads_back_memory_mapped_and_by_name(tmp_path):
    save(tmp_path, KEY, _ref())
    back = load(tmp_path, KEY)
    assert back is not None and back.loss == 1.25 and set(back.tensors) == {"a.weight", "b.bias"}
    assert all(torch.equal(back.tensors[n], t) for n, t in _ref().tensors.items())
    one = load(tmp_path, KEY, frozenset({"b.bias"}))
    assert one is not None and set(one.tensors) == {"b.bias"} and one.tensors["b.bias"].dtype == torch.bfloat16
    assert load(tmp_path, KEY, frozenset({"c.weight"})) is None  # a name it does not hold: made again
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".pt"]  # no temp file left


def test_another_models_key_reads_nothing():
    assert reference_key("a", "step", "cpu") != reference_key("b", "step", "cpu")
    assert reference_key("a", "step", "cpu") != reference_key("a", "output", "cpu")
    assert reference_key("a", "step", "cpu") != reference_key("a", "step", "cpu", "|fsdp")
    assert reference_key("a", "step", "cpu") != reference_key("a", "step", "cuda")


def test_a_checkpoint_rewritten_at_the_same_path_is_another_reference(tmp_path):
    ckpt = tmp_path / "model.pt"
    ckpt.write_bytes(b"1234")
    before = reference_key("a", "output", "cpu", checkpoint=str(ckpt))
    assert before == reference_key("a", "output", "cpu", checkpoint=str(ckpt))
    ckpt.write_bytes(b"123456")
    assert reference_key("a", "output", "cpu", checkpoint=str(ckpt)) != before


@pytest.mark.parametrize("damage", ["flip", "truncate", "no manifest", "no data", "other key", "garbage manifest"])
def test_a_damaged_or_missing_file_is_never_trusted(tmp_path, damage):
    save(tmp_path, KEY, _ref())
    data, manifest = _files(tmp_path)
    raw = bytearray(data.read_bytes())
    if damage == "flip":  # one bit of a tensor's bytes: the file still loads, its CRC does not match
        stored = bytes(_ref().tensors["a.weight"].numpy().tobytes())
        at = raw.find(stored)
        assert at > 0
        raw[at + 5] ^= 0x10
        data.write_bytes(bytes(raw))
    elif damage == "truncate":
        data.write_bytes(bytes(raw[: len(raw) // 2]))
    elif damage == "no manifest":
        manifest.unlink()
    elif damage == "no data":
        data.unlink()
    elif damage == "other key":
        doc = json.loads(manifest.read_text())
        manifest.write_text(json.dumps({**doc, "key": reference_key("x", "step", "cpu")}))
    else:
        manifest.write_text("{not json")
    assert load(tmp_path, KEY) is None
    save(tmp_path, KEY, _ref())  # made again: written whole over it
    assert load(tmp_path, KEY) is not None


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.int64]),
       st.lists(st.integers(1, 5), min_size=0, max_size=3), st.integers(0, 2**31 - 1))
def test_the_crc_sees_every_dtype_and_changes_with_any_element(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    t = (torch.randn(shape, generator=g) * 100).to(dtype)
    assert crc(t) == crc(t.clone())
    if t.numel():
        other = t.clone().reshape(-1)
        raw = other.view(torch.uint8)
        raw[seed % raw.numel()] ^= 1  # one bit of one element
        assert crc(other.reshape(t.shape)) != crc(t)
