"""costmodel.footprint: what a training step adds to a rank's memory, walked over its action order (pure)."""

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from costmodel.footprint import activation_bytes, rank_runtime_bytes, step_memory
from tests.conftest import toy_profile


def _segs(n, saved=300, saved_in=100, saved_out=100, out=100, params=1000, largest=600):
    prof = toy_profile([1.0] * n, out_bytes=out)
    return tuple(dataclasses.replace(s, saved_bytes=saved, saved_input_bytes=saved_in, saved_output_bytes=saved_out,
                                     param_bytes=params, largest_param_bytes=largest) for s in prof.segments)


def test_a_tensor_one_segment_saves_as_output_and_the_next_as_input_is_held_once():
    segs = _segs(4)[:3]  # three segments of one stage, each saving 300 B/sample of which 100 in, 100 out
    # the stage's input (the batch or torch's receive buffer) is held before the step: not counted
    assert activation_bytes(segs, last=True) == 900 - 2 * 100 - 100
    unsaved = tuple(dataclasses.replace(s, saved_output_bytes=0) for s in segs)
    # an output its stage does not save is still kept for the backward (torch's stage holds it)
    assert activation_bytes(unsaved, last=False) == 900 - 100 + 100
    assert activation_bytes(segs, last=False) == 900 - 2 * 100 - 100  # saved already: once


def _profile(n=2, **kw):
    prof = toy_profile([1.0] * n, batch=4)
    return dataclasses.replace(prof, segments=_segs(n, **kw))


def test_gpipe_peaks_at_its_first_backward_with_every_microbatch_held():
    prof = _profile(2, out=0, saved=100, saved_in=0, saved_out=0)
    # one stage per rank, microbatch 1: a = 100 B; P = 1000, L = 600
    gpipe = [["0F0", "0F1", "0F2", "0F3", "0B0", "0B1", "0B2", "0B3"],
             ["1F0", "1F1", "1F2", "1F3", "1B0", "1B1", "1B2", "1B3"]]
    m = step_memory(prof, [(0, 1), (1, 2)], 4, gpipe)
    assert m.stage_activation_bytes == (100, 100)
    # B0: 4a + P = 1400; B1: 3a + P + L = 1900; the optimizer on CPU: P + 2L = 2200
    assert m.rank_step_bytes == (2200, 2200)
    big = _profile(2, out=0, saved=1000, saved_in=0, saved_out=0)
    assert step_memory(big, [(0, 1), (1, 2)], 4, gpipe).rank_step_bytes == (4000 + 1000, 4000 + 1000)  # at B0


def test_1f1b_holds_fewer_microbatches_than_gpipe_and_cuda_steps_all_parameters_at_once():
    prof = _profile(2, out=0, saved=1000, saved_in=0, saved_out=0)
    one = [["0F0", "0F1", "0B0", "0F2", "0B1", "0F3", "0B2", "0B3"],
           ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2", "1F3", "1B3"]]
    m = step_memory(prof, [(0, 1), (1, 2)], 4, one)
    # rank 0 at 0B0: 2 held + P = 3000; at 0B1 (after 0F2): 2 held + P + L = 3600; rank 1: 1 held + P + L
    assert m.rank_step_bytes == (3600, max(1000 + 1000, 1000 + 1000 + 600, 1000 + 2 * 600))
    cuda = dataclasses.replace(prof, device="cuda")
    assert step_memory(cuda, [(0, 1), (1, 2)], 4, [["0F0", "0B0"], ["1F0", "1B0"]]).rank_step_bytes == (2000, 2000)


@given(st.integers(1, 8), st.integers(0, 5000), st.integers(0, 5000))
def test_a_step_adds_at_least_its_gradients_and_one_microbatch(chunks_log, saved, params):
    chunks = 2 ** (chunks_log % 4)
    prof = toy_profile([1.0, 1.0], batch=8)
    prof = dataclasses.replace(prof, segments=tuple(dataclasses.replace(s, saved_bytes=saved, param_bytes=params,
                                                                        largest_param_bytes=params)
                                                    for s in prof.segments))
    order = [[f"0F{i}" for i in range(chunks)] + [f"0B{i}" for i in range(chunks)]]
    m = step_memory(prof, [(0, 2)], chunks, order)
    per_mb = 2 * saved * (8 // chunks)
    assert m.rank_step_bytes[0] >= params * 2 + per_mb
    assert m.rank_step_bytes[0] <= params * 2 + 8 * 2 * saved + params * 2  # never more than all at once


def test_a_reports_runtime_is_each_ranks_own_least_gap():
    measured = [([500, 600], [100, 150]), ([450, 480], [90, 60])]
    assert rank_runtime_bytes(measured) == (360, 420)  # rank 0 (which also times the serial model) apart
    assert rank_runtime_bytes([]) == () and rank_runtime_bytes([([100], [150])]) == (0,)


def test_a_recomputed_layer_keeps_its_input_per_microbatch_and_its_activations_once_more_in_backward():
    prof = _profile(2, out=10, saved=1000, saved_in=0, saved_out=0)  # two layers on one stage, microbatch 2
    gpipe = [["0F0", "0F1", "0B0", "0B1"]]
    whole = step_memory(prof, [(0, 2)], 2, gpipe)
    again = step_memory(prof, [(0, 2)], 2, gpipe, recompute=[[1]])  # layer 1 recomputed: keeps layer 0's output
    assert whole.stage_activation_bytes == (2 * 2000,) and again.stage_activation_bytes == (2 * (1000 + 10),)
    # at 0B0: two microbatches held, the parameters' new gradients, and layer 1's 2 x 1000 B again as it recomputes
    assert again.rank_step_bytes[0] == 2 * 2020 + 2000 + 2000 < whole.rank_step_bytes[0]
