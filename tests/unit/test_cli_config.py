"""Where each setting came from (``kinetic config show``): pure provenance rules."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from kinetic._cli.config import derived_rows, knob_rows, profile_rows
from kinetic._core.config import (
    SETTING_VARIABLES,
    SettingSource,
    explain_settings,
    resolve_settings,
)

PROFILE = {"project": "prof-proj", "zone": "prof-zone", "cluster": "prof-cl", "builder": "docker"}


def explain(
    arguments: dict[str, Any], env: dict[str, str], profile: dict[str, str] | None
) -> dict[str, SettingSource]:
    settings = resolve_settings(**arguments, env=env, profile=profile, home="/home/u")
    rows = explain_settings(
        settings, arguments=arguments, env=env, profile=profile, profile_name="dev"
    )
    return {r.name: r for r in rows}


def test_every_setting_is_explained_with_the_resolved_value() -> None:
    rows = explain({}, {}, None)
    assert set(rows) == set(SETTING_VARIABLES)
    assert rows["zone"] == SettingSource("zone", "us-central1-a", "default")
    assert rows["backend"].value == "local"
    assert rows["backend"].detail == "no project: local"
    assert rows["local_root"].value == "/home/u/.kinetic/local"
    assert rows["builder"].value is None


@pytest.mark.parametrize("field", ["project", "zone", "cluster"])
def test_sources_follow_the_precedence(field: str) -> None:
    var = SETTING_VARIABLES[field]
    assert explain({field: "a"}, {var: "e"}, PROFILE)[field] == SettingSource(
        field, "a", "argument"
    )
    assert explain({}, {var: "e"}, PROFILE)[field] == SettingSource(field, "e", "environment", var)
    assert explain({}, {}, PROFILE)[field] == SettingSource(
        field, PROFILE[field], "profile", "profile 'dev'"
    )
    assert explain({}, {}, None)[field].source == "default"


def test_empty_values_fall_through_as_resolution_does() -> None:
    rows = explain({"zone": ""}, {"KINETIC_ZONE": ""}, {"zone": "pz"})
    assert rows["zone"] == SettingSource("zone", "pz", "profile", "profile 'dev'")


def test_project_from_google_cloud_project_and_inferred_backend() -> None:
    rows = explain({}, {"GOOGLE_CLOUD_PROJECT": "g"}, None)
    assert rows["project"] == SettingSource("project", "g", "environment", "GOOGLE_CLOUD_PROJECT")
    assert rows["backend"] == SettingSource("backend", "gke", "default", "a project is set: gke")
    # A profile's project wins over GOOGLE_CLOUD_PROJECT, and says so.
    assert explain({}, {"GOOGLE_CLOUD_PROJECT": "g"}, PROFILE)["project"].source == "profile"


def test_sources_agree_with_resolution_across_combinations() -> None:
    """For every mix of argument / variable / profile / nothing, the explained value is
    the resolved one, and the source names the layer that holds exactly that value."""
    layers = {"argument": "A", "environment": "E", "profile": "P", "default": None}
    for field in ("project", "zone", "cluster", "namespace", "base_image_repo"):
        var = SETTING_VARIABLES[field]
        for present in itertools.product([False, True], repeat=3):
            args = {field: "A"} if present[0] else {}
            env = {var: "E"} if present[1] else {}
            prof = {field: "P"} if present[2] else None
            row = explain(args, env, prof)[field]
            assert row.value == getattr(
                resolve_settings(**args, env=env, profile=prof, home="/h"), field
            )
            if row.source != "default":
                assert layers[row.source] == row.value


def test_backend_sources() -> None:
    assert explain({"backend": "local"}, {"KINETIC_BACKEND": "gke"}, None)["backend"].source == (
        "argument"
    )
    row = explain({}, {"KINETIC_BACKEND": "local", "KINETIC_PROJECT": "p"}, None)["backend"]
    assert (row.value, row.source, row.detail) == ("local", "environment", "KINETIC_BACKEND")


def test_derived_rows_bucket_and_registry() -> None:
    s = resolve_settings(project="p", cluster="c", env={}, profile=None, home="/h")
    bucket, registry = derived_rows(s, {})
    assert (bucket.value, bucket.source) == ("p-kn-c-jobs", "default")
    assert registry.value == "us-central1-docker.pkg.dev/p/kinetic"
    _, registry = derived_rows(s, {"KINETIC_IMAGE_REGISTRY": "127.0.0.1:5000"})
    assert (registry.value, registry.source) == ("127.0.0.1:5000", "environment")
    bucket, registry = derived_rows(resolve_settings(env={}, profile=None, home="/h"), {})
    assert bucket.value is None
    assert registry.value is None
    assert bucket.detail == "needs a project"


def test_knob_rows_list_defaults_then_other_variables() -> None:
    env = {"KINETIC_GKE_START_GRACE": "30", "KINETIC_ZONE": "z", "KINETIC_CUSTOM": "x"}
    rows = {r.name: r for r in knob_rows(env, shown=["KINETIC_ZONE"])}
    assert rows["gke_start_grace"] == SettingSource(
        "gke_start_grace", "30", "environment", "KINETIC_GKE_START_GRACE"
    )
    assert rows["k8s_qps"].source == "default"
    assert rows["KINETIC_CUSTOM"].value == "x"
    assert "KINETIC_ZONE" not in rows


def test_profile_rows() -> None:
    file_row, active = profile_rows("/p.json", "dev", {"KINETIC_PROFILE": "dev"})
    assert (file_row.source, active.source, active.value) == ("default", "environment", "dev")
    _, active = profile_rows("/p.json", "dev", {})
    assert active.source == "profile"
    _, active = profile_rows("/p.json", None, {})
    assert (active.value, active.source) == (None, "default")


def test_every_settings_field_has_a_source_rule() -> None:
    """A field added to Settings without a row here would be missing from config show."""
    import dataclasses

    from kinetic._core.config import Settings

    derived = {"backend_was_defaulted", "cluster_named"}  # facts about the others, not settings
    fields = {f.name for f in dataclasses.fields(Settings)} - derived
    assert fields == set(SETTING_VARIABLES)
