"""``kinetic doctor`` against the real testbed: every cluster check passes, and each
broken piece shows red with its fix.

The LeaderWorkerSet CRD is the one check whose answer depends on the testbed: the
tests ask the API server whether it is installed (through Kinetic's own client) and
expect ``ok`` when it is, else a warning (``gke``) or a failure (``pathways``) with
its install hint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import uuid
from typing import Any

import anyio
import pytest

from kinetic._backends.gke.client import KubeClient
from kinetic._cli.doctor_checks import LWS_CRD
from tests import fix_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


@pytest.fixture
def target(testbed: fix_cluster.Testbed) -> dict[str, str]:
    """The environment and options of a doctor run on the testbed, with a fresh bucket."""
    env = testbed.env
    project, cluster = "kt", f"d{uuid.uuid4().hex[:10]}"
    req = urllib.request.Request(
        f"{env['STORAGE_EMULATOR_HOST']}/storage/v1/b?project={project}",
        data=json.dumps({"name": f"{project}-kn-{cluster}-jobs"}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    urllib.request.urlopen(req, timeout=10).close()
    return {
        "KUBECONFIG": env["KUBECONFIG"],
        "STORAGE_EMULATOR_HOST": env["STORAGE_EMULATOR_HOST"],
        "DOCKER_HOST": env["DOCKER_HOST"],
        "KINETIC_IMAGE_REGISTRY": env["KINETIC_TESTBED_REGISTRY"],
        "KINETIC_GKE_SERVICE_ACCOUNT": env["KINETIC_TESTBED_SERVICE_ACCOUNT"],
        "KINETIC_BACKEND": "gke",
        "KINETIC_PROJECT": project,
        "KINETIC_CLUSTER": cluster,
        "KINETIC_NAMESPACE": env["KINETIC_TESTBED_NAMESPACE"],
    }


def doctor(env: dict[str, str], *args: str) -> tuple[int, dict[str, dict[str, Any]]]:
    proc = subprocess.run(
        [sys.executable, "-m", "kinetic", *args, "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **env},
    )
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, {c["name"]: c for c in json.loads(proc.stdout)["checks"]}


def lws_crd_installed(kubeconfig: str) -> bool:
    async def ask() -> bool:
        client = KubeClient(kubeconfig=kubeconfig)
        try:
            found = await client.get(
                f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{LWS_CRD}",
                what="get the LWS CRD",
            )
        finally:
            await client.aclose()
        return found is not None

    return anyio.run(ask)


CLUSTER_CHECKS = (
    "kubeconfig",
    "cluster",
    "bucket",
    "registry",
    "builder",
    "namespace",
    "service-account",
)


def test_the_testbed_is_green(target: dict[str, str]) -> None:
    code, checks = doctor(target)
    assert code == 0
    for name in ("python", "packages", "settings", "local-root", *CLUSTER_CHECKS):
        assert checks[name]["level"] == "ok", checks[name]
    assert "v1.20" in checks["cluster"]["detail"]
    assert checks["service-account"]["detail"].endswith("/kinetic")
    assert checks["builder"]["detail"].startswith("docker: Docker Engine")
    crd = checks["lws-crd"]
    if lws_crd_installed(target["KUBECONFIG"]):
        assert crd["level"] == "ok", crd
    else:
        assert crd["level"] == "warn", crd
        assert "kubectl apply" in crd["hint"]
        assert "lws" in crd["hint"]


def test_pathways_needs_the_lws_crd(target: dict[str, str]) -> None:
    code, checks = doctor(target, "--backend", "pathways")
    crd = checks["lws-crd"]
    if lws_crd_installed(target["KUBECONFIG"]):
        assert (code, crd["level"]) == (0, "ok"), crd
    else:
        assert (code, crd["level"]) == (1, "fail"), crd
        assert "kubectl apply" in crd["hint"]


def test_a_wrong_namespace_shows_red_with_its_fix(target: dict[str, str]) -> None:
    code, checks = doctor(target, "--namespace", "no-such-ns")
    assert code == 1
    assert checks["namespace"]["level"] == "fail"
    assert checks["namespace"]["hint"].startswith("kubectl create namespace no-such-ns")
    assert checks["service-account"]["level"] == "skip"
    assert checks["cluster"]["level"] == "ok"


def test_a_missing_bucket_and_service_account_show_red(target: dict[str, str]) -> None:
    broken = {**target, "KINETIC_GKE_SERVICE_ACCOUNT": "nobody"}
    code, checks = doctor(broken, "--cluster", "nobucket")
    assert code == 1
    bucket = checks["bucket"]
    assert bucket["level"] == "fail"
    assert "kt-kn-nobucket-jobs" in bucket["detail"]
    assert "gcloud storage buckets create gs://kt-kn-nobucket-jobs" in bucket["hint"]
    sa = checks["service-account"]
    assert sa["level"] == "fail"
    assert sa["hint"].startswith("kubectl create serviceaccount nobody -n")
    for name in ("cluster", "namespace", "registry", "builder"):
        assert checks[name]["level"] == "ok", checks[name]
