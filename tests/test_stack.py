"""pipeline.core.stack: a model's segments as the frameworks see them (input, one stack of layers, output)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.stack import NoStack, find_stack, nearest_allowed

LLAMA = ("model.embed_tokens", *(f"model.layers.{i}" for i in range(4)), "model.norm", "lm_head")
GPT2 = ("transformer.wte", "transformer.wpe", *(f"transformer.h.{i}" for i in range(3)), "transformer.ln_f", "lm_head")


def test_a_language_model_is_an_embedding_a_stack_and_a_head():
    s = find_stack(LLAMA)
    assert (s.prefix, s.starts, s.end, s.segments, s.pre, s.post, s.layers) == ("model.layers", (1, 2, 3, 4), 5, 7, 1, 2, 4)
    g = find_stack(GPT2)
    assert (g.prefix, g.pre, g.post, g.layers) == ("transformer.h", 2, 2, 3)
    # torchtitan's and Megatron's units keep the embedding part and the norm + head whole
    assert g.whole_cuts() == (2, 3, 4, 5)
    # DeepSpeed's layers: each segment outside the stack is one
    assert g.item_cuts() == (1, 2, 3, 4, 5, 6)
    assert g.items([1, 2, 10, 10, 10, 1, 5]) == [1, 2, 10, 10, 10, 1, 5]
    assert g.stage_layers([3, 5]) == [[0], [1, 2], []]


def test_at_layer_granularity_a_layer_spans_several_segments():
    names = ("embed", "layers.0.attn", "layers.0.mlp", "layers.1.attn", "layers.1.mlp", "head")
    s = find_stack(names)
    assert (s.starts, s.end) == ((1, 3), 5)
    assert s.whole_cuts() == (1, 3, 5) and s.item_cuts() == (1, 3, 5)
    assert s.items([1, 2, 3, 4, 5, 6]) == [1, 5, 9, 6]


@pytest.mark.parametrize("names, message", [
    (("conv1", "layer1.0", "layer1.1", "layer2.0", "fc"), r"2 stacks \(layer1, layer2\)"),
    (("stem", "head"), "no stack of numbered layers"),
    (("embed", "layers.0", "mid", "layers.1", "head"), "interrupted"),
    (("embed", "layers.0", "layers.2", "head"), "runs layer 2 after layer 0"),
    (("embed", "layers.1", "layers.2", "head"), "runs layer 1 first"),
])
def test_a_model_without_one_stack_says_why(names, message):
    with pytest.raises(NoStack, match=message):
        find_stack(names)


@given(st.data())
def test_nearest_allowed_cuts_increase_and_are_allowed(data):
    n = data.draw(st.integers(3, 12))
    allowed = sorted(data.draw(st.sets(st.integers(1, n - 1), min_size=1)))
    k = data.draw(st.integers(1, len(allowed)))
    cuts = sorted(data.draw(st.sets(st.integers(1, n - 1), min_size=k, max_size=k)))
    weights = data.draw(st.lists(st.integers(0, 100), min_size=n, max_size=n))
    prefix = [sum(weights[:i]) for i in range(n + 1)]
    out = nearest_allowed(cuts, allowed, prefix)
    assert len(out) == k and list(out) == sorted(set(out)) and set(out) <= set(allowed)
    if set(cuts) <= set(allowed):
        assert list(out) == cuts  # cuts already allowed stay where they are


def test_too_few_allowed_cuts_say_so():
    with pytest.raises(ValueError, match="only 2 stages"):
        nearest_allowed([1, 2], [1], [0, 1, 2, 3])
