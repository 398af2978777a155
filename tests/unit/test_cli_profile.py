"""``kinetic profile``: pure edits of the profiles document."""

from __future__ import annotations

import pytest

from kinetic._cli.profile import (
    ProfileNotFoundError,
    check_name,
    with_current,
    with_profile,
    without_profile,
)
from kinetic._core.config import parse_profiles
from kinetic._exceptions import ConfigError


def test_create_use_remove_round_trip_keeps_unknown_keys() -> None:
    doc = {"version": 7, "profiles": {"old": {"project": "o", "extra": "kept"}}}
    doc2 = with_profile(doc, "dev", {"project": "p", "zone": "z"}, replace=False)
    assert doc["profiles"].keys() == {"old"}  # the input is not modified
    doc3 = with_current(doc2, "dev")
    current, profiles = parse_profiles(doc3, "mem")
    assert current == "dev"
    assert profiles["dev"] == {"project": "p", "zone": "z"}
    assert doc3["version"] == 7
    assert doc3["profiles"]["old"]["extra"] == "kept"
    doc4 = without_profile(doc3, "dev")
    assert "current" not in doc4
    assert set(doc4["profiles"]) == {"old"}


def test_existing_names_need_replace() -> None:
    doc = with_profile({}, "dev", {"project": "p"}, replace=False)
    with pytest.raises(ConfigError, match="exists already"):
        with_profile(doc, "dev", {}, replace=False)
    assert with_profile(doc, "dev", {"zone": "z"}, replace=True)["profiles"]["dev"] == {"zone": "z"}


def test_missing_profiles_are_lookup_errors() -> None:
    with pytest.raises(ProfileNotFoundError) as info:
        with_current({"profiles": {}}, "nope")
    assert isinstance(info.value, LookupError)
    with pytest.raises(ProfileNotFoundError):
        without_profile({"profiles": {}}, "nope")


@pytest.mark.parametrize("name", ["", "a b", "../x", "-x", "x/y"])
def test_bad_names(name: str) -> None:
    with pytest.raises(ConfigError, match="invalid profile name"):
        check_name(name)
