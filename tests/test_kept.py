"""What a rank keeps between trials: tensors reused as they are, the rest made, the unneeded let go first."""

import torch

from pipeline.models.build import build_meta_model
from pipeline.models.kept import KeptTensors


def test_kept_tensors_are_reused_as_they_are_and_equal_fresh_ones(tiny_spec):
    meta = build_meta_model(tiny_spec)
    cpu = torch.device("cpu")
    first = [n for n in meta.tensors if n.startswith(("patch_embed.", "blocks.0.", "blocks.1."))]
    second = [n for n in meta.tensors if n.startswith(("blocks.1.", "blocks.2."))]
    kept = KeptTensors()
    a = kept.materialise(meta, first, cpu)
    assert kept.reused_bytes == 0 and sorted(kept.tensors) == sorted(first)
    gone = kept.keep_only(second)
    assert gone == meta.nbytes([n for n in first if n not in second]) > 0
    assert sorted(kept.tensors) == sorted(n for n in first if n in second)  # nothing of the old stage beyond the new
    b = kept.materialise(meta, second, cpu)
    shared = [n for n in second if n in first]
    assert shared and all(b[n] is a[n] for n in shared) and kept.reused_bytes == meta.nbytes(shared)
    fresh = meta.materialise(second, cpu)
    assert all(torch.equal(b[n], fresh[n]) for n in second)  # the same values by name, whoever made them
    kept.clear()
    assert kept.tensors == {} and kept.reused_bytes == 0
