"""Settings precedence, profiles parsing and env capture: pure, no event loop."""

from __future__ import annotations

import pytest

from kinetic._core.config import capture_env, parse_profiles, resolve_settings
from kinetic._exceptions import ConfigError, ProfileError

PROFILE = {
    "project": "prof-proj",
    "zone": "prof-zone",
    "cluster": "prof-cl",
    "namespace": "prof-ns",
}


def resolve(**kw: object) -> object:
    kw.setdefault("env", {})
    kw.setdefault("profile", None)
    kw.setdefault("home", "/home/u")
    return resolve_settings(**kw)  # type: ignore[arg-type]


def test_no_project_anywhere_means_local_backend_by_default() -> None:
    s = resolve()
    assert s.backend == "local"
    assert s.backend_was_defaulted
    assert s.project is None
    assert s.local_root == "/home/u/.kinetic/local"


def test_a_project_means_gke() -> None:
    s = resolve(env={"GOOGLE_CLOUD_PROJECT": "gcp"})
    assert (s.backend, s.project, s.backend_was_defaulted) == ("gke", "gcp", False)
    assert s.bucket_name == "gcp-kn-kinetic-cluster-jobs"


@pytest.mark.parametrize("field", ["project", "zone", "cluster", "namespace"])
def test_precedence_argument_env_profile_default(field: str) -> None:
    var = f"KINETIC_{field.upper()}"
    assert getattr(resolve(**{field: "arg"}, env={var: "env"}, profile=PROFILE), field) == "arg"
    assert getattr(resolve(env={var: "env"}, profile=PROFILE), field) == "env"
    assert getattr(resolve(profile=PROFILE), field) == PROFILE[field]
    defaults = {
        "project": None,
        "zone": "us-central1-a",
        "cluster": "kinetic-cluster",
        "namespace": "default",
    }
    assert getattr(resolve(), field) == defaults[field]


def test_google_cloud_project_is_the_last_project_fallback() -> None:
    assert resolve(env={"GOOGLE_CLOUD_PROJECT": "g"}, profile=PROFILE).project == "prof-proj"
    assert resolve(env={"GOOGLE_CLOUD_PROJECT": "g"}).project == "g"


def test_backend_argument_and_env() -> None:
    assert resolve(backend="local", env={"KINETIC_PROJECT": "p"}).backend == "local"
    assert resolve(env={"KINETIC_BACKEND": "local", "KINETIC_PROJECT": "p"}).backend == "local"
    with pytest.raises(ConfigError, match="unknown backend 'x'"):
        resolve(backend="x")


def test_local_root_from_env() -> None:
    assert resolve(env={"KINETIC_LOCAL_ROOT": "/data/k"}).local_root == "/data/k"


def test_bucket_name_needs_a_project() -> None:
    with pytest.raises(ConfigError, match="project"):
        _ = resolve().bucket_name


def test_parse_profiles_valid_and_stale_current() -> None:
    doc = {"current": "a", "profiles": {"a": dict(PROFILE), "b": {"project": "x"}}}
    current, profiles = parse_profiles(doc, "/p.json")
    assert current == "a"
    assert profiles["b"] == {"project": "x"}
    current, _ = parse_profiles({"current": "gone", "profiles": {}}, "/p.json")
    assert current is None


@pytest.mark.parametrize(
    "doc",
    [
        [],
        {"current": 3},
        {"profiles": []},
        {"profiles": {"a": "x"}},
        {"profiles": {"a": {"zone": 1}}},
    ],
)
def test_parse_profiles_malformed_names_the_file(doc: object) -> None:
    with pytest.raises(ProfileError, match="/etc/p.json"):
        parse_profiles(doc, "/etc/p.json")


def test_capture_env_names_and_prefixes() -> None:
    environ = {"A": "1", "AB": "2", "PRE_X": "3", "PRE_Y": "4", "OTHER": "5"}
    assert capture_env(["A", "PRE_*", "MISSING"], environ) == {"A": "1", "PRE_X": "3", "PRE_Y": "4"}
    assert capture_env(None, environ) == {}
    with pytest.raises(ConfigError):
        capture_env("A", environ)  # type: ignore[arg-type]
