"""Which kubeconfig context a job's cluster is (pure rules)."""

from __future__ import annotations

import pytest

from kinetic import ConfigError
from kinetic._core.kube_context import choose_context, gke_context_name

CONTEXTS = ["kinetic-testbed", "gke_p_us-central1-a_a", "gke_p_us-central1-a_b"]


def test_the_context_is_named_as_gcloud_names_it() -> None:
    assert gke_context_name("p", "us-central1-a", "a") == "gke_p_us-central1-a_a"
    assert gke_context_name(None, "us-central1-a", "a") is None
    assert gke_context_name("p", "", "a") is None


@pytest.mark.parametrize("wanted", ["gke_p_us-central1-a_a", "gke_p_us-central1-a_b"])
def test_each_cluster_gets_its_own_context_whatever_is_active(wanted: str) -> None:
    assert choose_context(wanted, None, CONTEXTS, current="kinetic-testbed") == wanted
    assert choose_context(wanted, None, CONTEXTS, current="gke_p_us-central1-a_a") == wanted


def test_the_override_wins_and_must_exist() -> None:
    assert choose_context("gke_p_us-central1-a_a", "kinetic-testbed", CONTEXTS, None) == (
        "kinetic-testbed"
    )
    with pytest.raises(ConfigError, match="KINETIC_KUBE_CONTEXT='nope'.*kinetic-testbed"):
        choose_context(None, "nope", CONTEXTS, "kinetic-testbed")


def test_a_cluster_without_a_context_uses_a_non_gke_active_context() -> None:
    # A test cluster (kind, the testbed) is whatever the kubeconfig has active.
    assert choose_context("gke_p_z_c", None, CONTEXTS, "kinetic-testbed") is None
    assert choose_context(None, None, CONTEXTS, "gke_p_us-central1-a_a") is None


def test_a_cluster_without_a_context_never_goes_to_another_gke_cluster() -> None:
    with pytest.raises(ConfigError, match="get-credentials c --zone z --project p") as info:
        choose_context("gke_p_z_c", None, CONTEXTS, "gke_p_us-central1-a_a")
    assert "gke_p_us-central1-a_a" in str(info.value)
