"""The cost model's data: a profile survives JSON, and an old or broken one says so."""

import json

import pytest

from costmodel.types import PROFILE_VERSION, Profile
from tests.conftest import toy_profile


def test_profile_json_round_trip():
    p = toy_profile([0.1, 0.2, 0.3], out_bytes=16)
    again = Profile.from_dict(json.loads(json.dumps(p.to_dict())))
    assert again == p and again.total_flops == 300


def test_an_old_profile_version_is_refused():
    d = toy_profile([0.1, 0.2]).to_dict() | {"version": PROFILE_VERSION - 1}
    with pytest.raises(ValueError, match="profile again"):
        Profile.from_dict(d)
