import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.plan import choose_chunks
from search.plans.space import PlanPoint, PlanSpace


def space(n=7, stages=3, chunks=(1, 4, 8)):
    return PlanSpace(names=tuple(f"s{i}" for i in range(n)), stages=stages, chunks=chunks)


def test_params_are_module_names_and_round_trip():
    sp = space()
    p = PlanPoint(cuts=(2, 5), chunks=8)
    assert sp.encode(p) == {"cut_1": "s2", "cut_2": "s5", "chunks": 8}
    assert sp.decode(sp.encode(p)) == p
    assert sp.choices()["cut_1"] == ("s1", "s2", "s3", "s4", "s5", "s6")  # the same fixed list for every cut
    assert sp.size == 15 * 3
    assert sp.stage_blocks(p) == [2, 3, 2]


def test_out_of_order_or_unknown_params_name_the_problem():
    sp = space()
    with pytest.raises(ValueError, match="cuts must start strictly later stages"):
        sp.decode({"cut_1": "s5", "cut_2": "s2", "chunks": 8})
    with pytest.raises(ValueError, match="lack or misname 'cut_2'"):
        sp.decode({"cut_1": "s5", "chunks": 8})
    with pytest.raises(ValueError, match="8 stages need at least 8 segments, the model has 7"):
        space(stages=8)


@given(st.integers(2, 60), st.data())
def test_neighbours_and_random_plans_are_always_valid(n, data):
    stages = data.draw(st.integers(2, min(n, 10)))
    sp = space(n=n, stages=stages)
    rng = random.Random(data.draw(st.integers(0, 10**6)))
    p = sp.random_point(rng)
    assert sp.valid(p) and sp.decode(sp.encode(p)) == p
    radius = data.draw(st.integers(1, 4))
    for q in sp.neighbours(p, radius):
        assert sp.valid(q) and q != p


def test_chunks_neighbours_step_along_the_list():
    sp = space()
    near = set(sp.neighbours(PlanPoint(cuts=(2, 5), chunks=4)))
    assert PlanPoint(cuts=(2, 5), chunks=1) in near and PlanPoint(cuts=(2, 5), chunks=8) in near
    assert PlanPoint(cuts=(3, 5), chunks=4) in near and PlanPoint(cuts=(2, 4), chunks=4) in near


def test_default_chunks_that_do_not_divide_are_dropped():
    assert choose_chunks(None, 32, [1, 3, 4, 4, 64, 32]) == [1, 4, 32]


def layered(n=8):
    from search.plans.space import Layout

    return PlanSpace(names=tuple(f"s{i}" for i in range(n)), stages=2, chunks=(2, 4),
                     layouts=(Layout(schedule="GPipe", chunks=(2, 4)), Layout(schedule="1F1B", chunks=(2, 4)),
                              Layout(schedule="Interleaved1F1B", per_rank=2, chunks=(4,))))


def test_a_layout_is_a_parameter_and_asks_only_for_its_own_cuts():
    sp = layered()
    p = PlanPoint(cuts=(2, 4, 6), chunks=4, layout=2)
    assert sp.encode(p) == {"layout": "Interleaved1F1B/V2", "cut_1": "s2", "cut_2": "s4", "cut_3": "s6", "chunks": 4}
    assert sp.decode(sp.encode(p)) == p
    asked = []
    params = sp.ask(lambda name, choices: asked.append(name) or ("GPipe" if name == "layout" else choices[0]))
    assert asked == ["layout", "cut_1", "chunks"] and sp.decode(params) == PlanPoint(cuts=(1,), chunks=2)
    assert sp.size == 7 * 2 * 2 + 35 * 1
    with pytest.raises(ValueError, match="chunks one of \\[4\\]"):
        sp.decode({"layout": "Interleaved1F1B/V2", "cut_1": "s2", "cut_2": "s4", "cut_3": "s6", "chunks": 2})


def test_one_layout_keeps_the_space_as_it_was():
    assert "layout" not in space().choices() and space().param_names() == ["cut_1", "cut_2", "chunks"]


def test_a_neighbour_may_change_the_schedule_at_the_same_stages_per_rank():
    sp = layered()
    near = set(sp.neighbours(PlanPoint(cuts=(3,), chunks=4, layout=0)))
    assert PlanPoint(cuts=(3,), chunks=4, layout=1) in near
    assert not [q for q in near if q.layout == 2]


@given(st.data())
def test_random_plans_and_neighbours_of_every_layout_are_valid(data):
    sp = layered(n=data.draw(st.integers(4, 30)))
    p = sp.random_point(random.Random(data.draw(st.integers(0, 10**6))))
    assert sp.valid(p) and sp.decode(sp.encode(p)) == p
    assert all(sp.valid(q) for q in sp.neighbours(p, data.draw(st.integers(1, 3))))
