"""pipeline.stage.skips: tensors a stage sends to several later stages that carry no gradient (a Llama's rotary
cos/sin) are found in the split graph, so that torch's traced frontend trains such a split."""

import pytest

from pipeline.models.batch import example_input, rows
from pipeline.models.build import build_model, resolve_spec
from pipeline.stage.skips import grad_needs

LLAMA = {"num_hidden_layers": 3, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2,
         "num_key_value_heads": 2, "vocab_size": 128}


def test_the_rotary_cos_and_sin_and_the_mask_carry_no_gradient():
    from torch.distributed.pipelining import SplitPoint, pipeline

    spec = resolve_spec("hf:llama", kwargs=LLAMA, batch_size=4, seq_len=8)
    pipe = pipeline(build_model(spec), mb_args=tuple(rows(example_input(spec), 2)),
                    split_spec={"model.layers.1": SplitPoint.BEGINNING, "model.layers.2": SplitPoint.BEGINNING})
    needs = list(grad_needs(pipe.split_gm).values())  # one entry per stage, in order
    assert len(needs) == 3
    ins0, outs0 = needs[0]
    assert ins0 == [False]  # token ids
    assert sorted(outs0) == [False, False, False, True]  # the hidden states only; cos, sin and the mask carry none
    ins2, outs2 = needs[2]
    assert sorted(ins2) == [False, False, False, True] and outs2 == [True]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_llama_trains_on_three_stages_whose_later_two_read_the_rotary_tensors(capsys):
    from pipeline.run import main

    code = main(["--model", "hf:llama", "--model-kwargs", __import__("json").dumps(LLAMA), "--seq-len", "8",
                 "--batch-size", "4", "--split-points", "model.layers.1,model.layers.2", "--chunks", "4", "--mode",
                 "train", "--schedule", "1F1B", "--repeats", "1", "--no-serial-all"])
    out = capsys.readouterr().out
    assert code == 0, out[-2000:]
    assert "training step check vs the serial step" in out
