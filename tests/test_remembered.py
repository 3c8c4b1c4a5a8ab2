"""The frameworks' rules' answers are remembered: asked of their own code once, read back after, never trusted
from a file that cannot be read, asked again for another framework version."""

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.policies import PolicyInputs
from pipeline.peers import remembered
from pipeline.peers.remembered import FILE, RememberedRules
from pipeline.peers.rules import PEERS

NAMES = ("embed", *(f"layers.{i}" for i in range(8)), "head")
INPUTS = PolicyInputs(unit_elements=(1,) * 10, segment_elements=(4, *(10,) * 8, 4), segment_names=NAMES)


def counted(name):
    """The framework policy ``name`` whose rule counts its calls (the framework's own code still runs)."""
    calls = []
    pol = PEERS[name]

    def rule(inputs, stages):
        calls.append(stages)
        return pol.rule(inputs, stages)

    return dataclasses.replace(pol, rule=rule), calls


@pytest.mark.parametrize("name", ["torchtitan", "megatron", "deepspeed-parameters"])
def test_a_frameworks_cuts_come_from_its_code_once_then_from_the_folder(tmp_path, name):
    pol, calls = counted(name)
    first = RememberedRules(folder=str(tmp_path)).cuts(pol, INPUTS, 4)
    assert first == PEERS[name].cuts(INPUTS, 4) and calls == [4]
    again = RememberedRules(folder=str(tmp_path)).cuts(pol, INPUTS, 4)  # a later search's
    assert again == first and calls == [4]
    RememberedRules(folder=str(tmp_path)).cuts(pol, INPUTS, 2)  # another stage count is asked
    assert calls == [4, 2]


def test_a_refusal_is_remembered_with_its_reason(tmp_path):
    pol, calls = counted("megatron")
    with pytest.raises(ValueError) as first:
        RememberedRules(folder=str(tmp_path)).cuts(pol, INPUTS, 7)  # 8 layers on 7 stages: Megatron refuses
    with pytest.raises(ValueError) as again:
        RememberedRules(folder=str(tmp_path)).cuts(pol, INPUTS, 7)
    assert str(again.value) == str(first.value) and len(calls) == 1


@pytest.mark.parametrize("damage", ["{not json", "[1, 2]", '{"x": 1}'])
def test_an_unreadable_file_is_asked_again_and_rewritten(tmp_path, damage):
    pol, calls = counted("torchtitan")
    (tmp_path / FILE).write_text(damage)
    assert RememberedRules(folder=str(tmp_path)).cuts(pol, INPUTS, 4) == PEERS["torchtitan"].cuts(INPUTS, 4)
    assert calls == [4] and isinstance(json.loads((tmp_path / FILE).read_text()), dict)


def test_a_damaged_entry_is_asked_again(tmp_path):
    pol, calls = counted("torchtitan")
    rules = RememberedRules(folder=str(tmp_path))
    rules.cuts(pol, INPUTS, 4)
    (tmp_path / FILE).write_text(json.dumps({k: {"cuts": "three"} for k in json.loads((tmp_path / FILE).read_text())}))
    assert rules.cuts(pol, INPUTS, 4) == PEERS["torchtitan"].cuts(INPUTS, 4) and calls == [4, 4]


def test_another_framework_version_or_no_folder_asks_its_code(tmp_path, monkeypatch):
    pol, calls = counted("deepspeed-parameters")
    RememberedRules(folder=str(tmp_path)).cuts(pol, INPUTS, 4)
    RememberedRules(folder=None).cuts(pol, INPUTS, 4)
    assert calls == [4, 4] and not (tmp_path / "None").exists()
    monkeypatch.setattr(remembered, "framework_version", lambda framework: "0.0.0-other")
    RememberedRules(folder=str(tmp_path)).cuts(pol, INPUTS, 4)
    assert calls == [4, 4, 4]


def test_a_folder_that_cannot_be_written_only_costs_the_imports(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    pol, calls = counted("torchtitan")
    rules = RememberedRules(folder=str(blocker / "sub"))
    assert rules.cuts(pol, INPUTS, 4) == rules.cuts(pol, INPUTS, 4) and calls == [4, 4]


def test_a_policy_of_no_framework_is_computed_as_it_is(tmp_path):
    from pipeline.peers.registry import POLICIES

    assert RememberedRules(folder=str(tmp_path)).cuts(POLICIES["uniform"], INPUTS, 4) == \
        POLICIES["uniform"].cuts(INPUTS, 4)
    assert not (tmp_path / FILE).exists()


@settings(max_examples=15, deadline=None)
@given(times=st.lists(st.floats(0.001, 10.0), min_size=10, max_size=10))
def test_measured_times_do_not_key_an_answer(tmp_path_factory, times):
    """The frameworks' rules never read times or FLOPs: a new profile of the same model reads the same answer."""
    folder = str(tmp_path_factory.mktemp("rules"))
    pol, calls = counted("megatron")
    RememberedRules(folder=folder).cuts(pol, INPUTS, 4)
    timed = dataclasses.replace(INPUTS, segment_times=tuple(times), segment_flops=tuple(range(10)))
    assert RememberedRules(folder=folder).cuts(pol, timed, 4) == PEERS["megatron"].cuts(timed, 4)
    assert calls == [4]
