"""``kinetic doctor``: the pure decisions (levels, hints, verdict, output)."""

from __future__ import annotations

import pytest

from kinetic._cli.doctor import document, exit_status, summary
from kinetic._cli.doctor_checks import (
    LWS_CRD,
    crd_result,
    kubeconfig_result,
    packages_result,
    python_result,
)
from kinetic._cli.doctor_result import CheckResult, fail, ok, skip, warn
from kinetic._core.config import resolve_settings
from kinetic._core.kubeconfig import ContextRef, config_path


def test_python_versions() -> None:
    assert python_result((3, 11, 2)).level == "ok"
    old = python_result((3, 10, 12))
    assert old.level == "fail"
    assert old.hint is not None
    assert "3.11" in old.hint


def test_packages() -> None:
    good = packages_result("0.1.0", {"anyio": "4.4", "tenacity": "8.2"})
    assert good.level == "ok"
    assert "anyio 4.4" in good.detail
    assert "(2 dependencies present)" in good.detail
    bad = packages_result("0.1.0", {"anyio": "4.4", "tenacity": None})
    assert bad.level == "fail"
    assert "missing: tenacity" in bad.detail
    assert bad.hint


def test_kubeconfig_results() -> None:
    settings = resolve_settings(project="p", cluster="c", env={}, profile=None, home="/h")
    missing = kubeconfig_result("/k", None, None, in_cluster=False, settings=settings)
    assert missing.level == "fail"
    assert missing.hint is not None
    assert "get-credentials c --zone us-central1-a --project p" in missing.hint
    assert kubeconfig_result("/k", None, None, in_cluster=True).level == "ok"
    contexts = ["a"]
    no_current = kubeconfig_result("/k", contexts, None, in_cluster=False)
    assert no_current.level == "fail"
    assert no_current.hint == "kubectl config use-context NAME"
    active = ContextRef(name="a", cluster="ca", user=None, namespace="ns")
    good = kubeconfig_result("/k", contexts, active, in_cluster=False)
    assert good.level == "ok"
    assert "context a (cluster ca, namespace ns)" in good.detail
    broken = kubeconfig_result("/k", None, None, in_cluster=False, error="bad yaml")
    assert (broken.level, broken.detail) == ("fail", "/k: bad yaml")


def test_kubeconfig_path() -> None:
    assert config_path({"KUBECONFIG": "/a:/b"}, "/h") == "/a"
    assert config_path({}, "/h") == "/h/.kube/config"


def test_lws_crd_is_required_by_pathways_only() -> None:
    assert crd_result(True, "gke").level == "ok"
    absent = crd_result(False, "gke")
    assert absent.level == "warn"
    assert absent.hint is not None
    assert "lws" in absent.hint
    assert LWS_CRD in absent.detail
    assert crd_result(False, "pathways").level == "fail"


def test_verdict_summary_and_document() -> None:
    results = [ok("a", "fine"), warn("b", "meh", "fix b"), skip("c", "n/a")]
    assert exit_status(results) == 0
    assert summary(results) == "1 ok, 1 warn, 1 skip"
    results.append(fail("d", "broken", "fix d"))
    assert exit_status(results) == 1
    doc = document(results)
    assert doc["ok"] is False
    assert doc["checks"][3] == {"name": "d", "level": "fail", "detail": "broken", "hint": "fix d"}


def test_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError, match="level"):
        CheckResult("x", "great", "")
