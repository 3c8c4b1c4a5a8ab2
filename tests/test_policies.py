import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.policies import balanced_cuts, equal_size_cuts, nearest_boundaries, uniform_cuts


def test_uniform_spreads_the_remainder_first():
    assert uniform_cuts(12, 4) == [3, 6, 9]
    assert uniform_cuts(10, 4) == [3, 6, 8]
    with pytest.raises(ValueError, match="cannot make 5 stages from 4 items"):
        uniform_cuts(4, 5)


def test_equal_size_fills_greedily_to_total_over_stages():
    # threshold 10: [4, 4] fit, 4 overflows -> cut; [4, 4] ... a 12 alone becomes its own stage
    assert equal_size_cuts([4, 4, 4, 4, 4, 10], 3) == [2, 4]
    assert equal_size_cuts([1, 12, 1, 1, 15], 3) == [1, 2]


def test_equal_size_reports_too_few_stages():
    with pytest.raises(ValueError, match="makes only 2 stages here, not 3"):
        equal_size_cuts([1, 1, 100], 3)


def _brute(weights, stages):
    n = len(weights)
    best = None
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = [0, *cuts, n]
        cost = max(sum(weights[a:b]) for a, b in zip(bounds, bounds[1:]))
        if best is None or cost < best - 1e-12:
            best = cost
    return best


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=2, max_size=9), st.integers(2, 5))
def test_balanced_is_optimal_against_brute_force(weights, stages):
    stages = min(stages, len(weights))
    cuts = balanced_cuts(weights, stages)
    assert cuts == sorted(cuts) and len(set(cuts)) == stages - 1 and all(0 < c < len(weights) for c in cuts)
    bounds = [0, *cuts, len(weights)]
    cost = max(sum(weights[a:b]) for a, b in zip(bounds, bounds[1:]))
    assert cost == pytest.approx(_brute(weights, stages))


@pytest.mark.slow
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_equal_size_matches_real_pippy(tiny_spec, stages):
    """The pure rule picks the same cuts as torchpippy's split_into_equal_size on the traced model."""
    import pippy
    from pippy.IR import pipe_split

    from pipeline.models.batch import example_input
    from pipeline.models.build import build_model
    from pipeline.models.candidates import find_candidates

    c = find_candidates(build_model(tiny_spec), tiny_spec)
    ours = [c.units[i][0] for i in equal_size_cuts([n for _, n in c.units], stages)]
    theirs = []

    def policy(gm):
        gm = pippy.split_into_equal_size(stages)(gm)
        nodes = list(gm.graph.nodes)
        for i, n in enumerate(nodes):
            if n.op == "call_function" and n.target is pipe_split:
                stack = nodes[i + 1].meta["nn_module_stack"]
                path = list(stack.values())[-1][0]
                theirs.append(path.replace("L['self'].", "").replace("[", ".").replace("]", ""))
        return gm

    pippy.Pipe.from_tracing(build_model(tiny_spec), 1, example_input(tiny_spec), split_policy=policy)
    assert ours == theirs


def test_nearest_boundaries_maps_mid_block_cuts_to_block_cuts():
    before = [0.0, 0.1, 0.4, 0.5, 0.9]  # share of the parameters before each of 5 blocks
    assert nearest_boundaries([0.45], before) == [2]  # ties go to the earlier block
    assert nearest_boundaries([0.47], before) == [3]
    assert nearest_boundaries([0.4, 0.41], before) == [2, 3]  # a collision moves the later cut on
    assert nearest_boundaries([0.01, 0.99], before) == [1, 4]
    assert nearest_boundaries([0.95, 0.99], before) == [3, 4]  # the first leaves room for the second
    with pytest.raises(ValueError, match="do not fit"):
        nearest_boundaries([0.1] * 5, before)


def test_the_registry_is_the_one_set_of_names():
    from pipeline.core.policies import ALIASES, PIPPY, POLICIES, PolicyInputs, policy

    assert list(POLICIES) == [PIPPY, "uniform", "params-balanced", "time-balanced", "flops-balanced"]
    assert policy("equal-size") is POLICIES[PIPPY] and policy("params").name == "params-balanced"
    assert set(ALIASES.values()) <= set(POLICIES)
    inputs = PolicyInputs(unit_elements=(4, 4, 4, 4), segment_elements=(1, 1, 10, 1))
    assert POLICIES[PIPPY].cuts(inputs, 2) == [2] and POLICIES[PIPPY].on_units
    assert POLICIES["params-balanced"].cuts(inputs, 2) == [2]
    with pytest.raises(ValueError, match="only a profile measures"):
        POLICIES["time-balanced"].cuts(inputs, 2)
    with pytest.raises(ValueError, match="policy 'nope' is unknown: use one of pippy-equal-size"):
        policy("nope")
