"""The pure rule: a named cluster without a kubeconfig context, while the active context
is no GKE cluster's, is refused."""

from __future__ import annotations

import pytest

from kinetic import ConfigError
from kinetic._core.config import resolve_settings
from kinetic._core.kube_context import check_named_cluster

WANTED = "gke_p_us-central1-a_prod"


@pytest.mark.parametrize(
    ("available", "current"),
    [
        ([WANTED, "kind-dev"], "kind-dev"),  # its context exists: used, whatever is active
        (["gke_p_us-central1-a_other"], "gke_p_us-central1-a_other"),  # choose_context's case
        ([], None),  # no active context: loading the kubeconfig says so
    ],
)
def test_accepted(available: list[str], current: str | None) -> None:
    check_named_cluster(WANTED, available, current)


def test_refused_when_the_active_context_is_another_kind() -> None:
    with pytest.raises(ConfigError, match=r"KINETIC_KUBE_CONTEXT=k3d-x to use the active"):
        check_named_cluster(WANTED, ["k3d-x"], "k3d-x")


@pytest.mark.parametrize(
    ("args", "env", "profile", "named"),
    [
        ({}, {}, None, False),
        ({"cluster": "c"}, {}, None, True),
        ({"zone": "z"}, {}, None, True),
        ({}, {"KINETIC_CLUSTER": "c"}, None, True),
        ({}, {}, {"zone": "z"}, True),
        ({}, {"KINETIC_PROJECT": "p"}, {"project": "p"}, False),
    ],
)
def test_settings_know_whether_the_cluster_was_named(
    args: dict[str, str], env: dict[str, str], profile: dict[str, str] | None, named: bool
) -> None:
    settings = resolve_settings(**args, env=env, profile=profile, home="/h")
    assert settings.cluster_named is named
