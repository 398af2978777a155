"""A job's pod cannot act on the others: no Kubernetes credentials unless it asks, no
capabilities, no privilege escalation, the runtime's default seccomp filter. Checked
inside real pods of the testbed, whose apiserver accepted the manifests."""

from __future__ import annotations

from typing import Any

import pytest

import kinetic
from tests.fix_cluster import GKETarget
from tests.sync_http import SyncHttp

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def what_the_pod_holds() -> dict[str, object]:
    """The job's own view: its credentials and its privileges (``/proc/self/status``)."""
    import os

    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    return {
        "token": os.path.exists(TOKEN),
        "capabilities": int(status["CapEff"].strip(), 16),
        "no_new_privileges": status["NoNewPrivs"].strip(),
        "seccomp": status["Seccomp"].strip(),  # 2: a filter
    }


def test_a_jobs_pod_holds_no_token_and_no_privileges(gke: GKETarget) -> None:
    seen = kinetic.run(**gke.run_args())(what_the_pod_holds)()
    assert seen == {
        "token": False,
        "capabilities": 0,
        "no_new_privileges": "1",
        "seccomp": "2",
    }


def test_a_job_that_asks_for_the_api_gets_its_accounts_token(
    gke: GKETarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``KINETIC_GKE_JOB_API_ACCESS=true``: the pod spec asks for the token (a job that
    submits jobs); the rest of the hardening stays."""
    monkeypatch.setenv("KINETIC_GKE_JOB_API_ACCESS", "true")
    job = kinetic.run(**gke.run_args())(what_the_pod_holds).run_async()
    seen = job.result(timeout=240, cleanup=False)
    assert seen["capabilities"] == 0
    assert seen["no_new_privileges"] == "1"
    assert [p["spec"]["automountServiceAccountToken"] for p in pods_of(gke, job.job_id)] == [True]
    job.cleanup()


def pods_of(gke: GKETarget, job_id: str) -> list[dict[str, Any]]:
    """The job's pods, as the testbed's apiserver has them."""
    env = gke.testbed.env
    http = SyncHttp(
        env.get("KINETIC_TESTBED_API_SERVER", "https://127.0.0.1:6443"),
        headers={"Authorization": f"Bearer {env.get('KINETIC_TESTBED_TOKEN', '')}"},
        verify=False,
        timeout=10,
    )
    resp = http.get(
        f"/api/v1/namespaces/{gke.namespace}/pods", params={"labelSelector": f"job-id={job_id}"}
    )
    resp.raise_for_status()
    return list(resp.json()["items"])
