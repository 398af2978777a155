"""The pods' identity that ``kinetic up`` sets up, on the testbed's real Kubernetes:
the service account carries the Workload Identity annotation, what ``up`` made in
Google Cloud is recorded in the cluster with the rest and ``down`` removes exactly
that, and a job sent with no ``KINETIC_GKE_SERVICE_ACCOUNT`` runs as that service
account. The Google side (IAM, Artifact Registry: no emulator exists) is
``tests.fix_google.FakeGoogle`` on loopback; Kubernetes is real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import pytest

import kinetic
from kinetic._backends.gke.client import KubeClient
from kinetic._exceptions import BackendError
from kinetic._infra import cloud, ops
from kinetic._infra.google_rest import GoogleRest
from kinetic._infra.identity import WI_ANNOTATION, CloudItem, CloudSpec
from kinetic._infra.plan import SetupSpec
from tests import fix_cluster
from tests.fix_google import FakeGoogle

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

GSA = "kn-c-ns@kt.iam.gserviceaccount.com"


@pytest.fixture
async def kube(testbed: fix_cluster.Testbed) -> AsyncIterator[tuple[KubeClient, str]]:
    namespace = f"kn-id-{uuid.uuid4().hex[:8]}"
    client = KubeClient(kubeconfig=testbed.env["KUBECONFIG"])
    try:
        yield client, namespace
    finally:
        with anyio.CancelScope(shield=True):
            await client._request("DELETE", f"/api/v1/namespaces/{namespace}", what="clean up")
            await client.aclose()


async def token() -> str:
    return "t"


def cloud_step(rest: GoogleRest, spec: CloudSpec) -> ops.CloudStep:
    async def step(record: Sequence[CloudItem], created: list[CloudItem]) -> list[ops.Outcome]:
        return await cloud.ensure(rest, spec, record, created)

    return step


def removal(rest: GoogleRest) -> ops.CloudRemoval:
    async def remove(items: Sequence[CloudItem]) -> list[ops.Outcome]:
        return await cloud.remove(rest, "kt", items)

    return remove


async def test_up_annotates_records_its_cloud_side_and_down_removes_exactly_that(
    kube: tuple[KubeClient, str],
) -> None:
    client, ns = kube
    google = FakeGoogle(project="kt")
    google.buckets.add("kt-kn-c-jobs")
    side = CloudSpec("kt", "us-central1", "c", ns, "kinetic", "kt-kn-c-jobs", ("n@kt",))
    spec = SetupSpec(namespace=ns, lws_crd=False, gcp_service_account=side.gsa)
    async with (
        google.serve() as roots,
        GoogleRest(token, roots=roots, poll_interval=0.001) as rest,
    ):
        # An up from before the Google side existed: a service account with no annotation.
        plain = await ops.set_up(client, None, SetupSpec(namespace=ns, lws_crd=False))
        assert {o.item: o.result for o in plain}[f"ServiceAccount {ns}/kinetic"] == "created"

        done = await ops.set_up(client, None, spec, cloud=cloud_step(rest, side))
        results = {o.item: o.result for o in done}
        assert results[f"ServiceAccount {ns}/kinetic"] == "annotated"
        assert sum(r == "created" for r in results.values()) == 6  # repo, account, 4 grants
        account = await client.get(f"/api/v1/namespaces/{ns}/serviceaccounts/kinetic", what="sa")
        assert account["metadata"]["annotations"][WI_ANNOTATION] == side.gsa
        record = await ops.teardown_plan(client, ns)
        assert [i.kind for i in record.cloud] == ["repository", "service-account"] + ["grant"] * 4

        again = await ops.set_up(client, None, spec, cloud=cloud_step(rest, side))
        assert {o.result for o in again} == {"kept"}
        assert (await ops.teardown_plan(client, ns)) == record

        lines = ops.describe(record, ns)
        assert f"Google service account {side.gsa}" in lines
        gone = await ops.tear_down(client, None, ns, cloud=removal(rest))
        assert {o.result for o in gone} == {"deleted"}
        assert google.repositories == {}
        assert google.accounts == {}
        assert google.members("kt-kn-c-jobs", "roles/storage.objectUser") == []


async def test_a_failed_cloud_step_still_records_what_it_made(
    kube: tuple[KubeClient, str],
) -> None:
    client, ns = kube
    google = FakeGoogle(project="kt")  # no bucket: its grant fails
    side = CloudSpec("kt", "us-central1", "c", ns, "kinetic", "kt-kn-c-jobs")
    spec = SetupSpec(namespace=ns, lws_crd=False, gcp_service_account=side.gsa)
    async with (
        google.serve() as roots,
        GoogleRest(token, roots=roots, poll_interval=0.001) as rest,
    ):
        with pytest.raises(BackendError, match="bucket kt-kn-c-jobs does not exist"):
            await ops.set_up(client, None, spec, cloud=cloud_step(rest, side))
        record = await ops.teardown_plan(client, ns)
        assert [i.kind for i in record.cloud] == ["repository", "service-account"]
        # down without the project refuses, rather than forget the Google side.
        with pytest.raises(kinetic.ConfigError, match="not --use-kubeconfig"):
            await ops.tear_down(client, None, ns)
        await ops.tear_down(client, None, ns, cloud=removal(rest))
        assert google.repositories == {}
        assert google.accounts == {}


def ran(x: int) -> int:
    return x + 1


def test_a_job_runs_as_the_service_account_up_made(
    gke: fix_cluster.GKETarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = f"kn-id-{uuid.uuid4().hex[:8]}"
    kubeconfig = gke.testbed.env["KUBECONFIG"]

    async def up() -> None:
        client = KubeClient(kubeconfig=kubeconfig)
        try:
            spec = SetupSpec(namespace=ns, lws_crd=False, gcp_service_account=GSA)
            await ops.set_up(client, None, spec)
        finally:
            await client.aclose()

    async def job_spec(name: str) -> Any:
        client = KubeClient(kubeconfig=kubeconfig)
        try:
            job = await client.get(f"/apis/batch/v1/namespaces/{ns}/jobs/{name}", what="job")
            return job["spec"]["template"]["spec"]
        finally:
            await client.aclose()

    async def clean() -> None:
        client = KubeClient(kubeconfig=kubeconfig)
        try:
            await client._request("DELETE", f"/api/v1/namespaces/{ns}", what="clean up")
        finally:
            await client.aclose()

    anyio.run(up)
    try:
        monkeypatch.delenv("KINETIC_GKE_SERVICE_ACCOUNT")  # the backend chooses
        # The shared testbed's node may be full for a while: let the pod wait its turn.
        monkeypatch.setenv("KINETIC_GKE_START_GRACE", "150")
        fn = kinetic.run(**gke.run_args(namespace=ns))(ran)
        job = fn.run_async(41)
        assert job.result(timeout=180, cleanup=False) == 42
        pod = anyio.run(job_spec, job.k8s_name)
        assert pod["serviceAccountName"] == "kinetic"
        job.cleanup()
    finally:
        anyio.run(clean)


def test_doctor_checks_the_identity_up_set_up(testbed: fix_cluster.Testbed) -> None:
    """Where jobs reach Google Cloud for real (no storage emulator), doctor reads the
    service account's Workload Identity annotation, then checks the Google side
    (here without Google credentials: each piece says it was not checked, and how to
    get them)."""
    env = testbed.env
    ns = f"kn-id-{uuid.uuid4().hex[:8]}"
    gsa = CloudSpec("kt", "us-central1", "cdoc", ns, "kinetic").gsa

    async def up() -> None:
        client = KubeClient(kubeconfig=env["KUBECONFIG"])
        try:
            spec = SetupSpec(namespace=ns, lws_crd=False, gcp_service_account=gsa)
            await ops.set_up(client, None, spec)
        finally:
            await client.aclose()

    async def clean() -> None:
        client = KubeClient(kubeconfig=env["KUBECONFIG"])
        try:
            await client._request("DELETE", f"/api/v1/namespaces/{ns}", what="clean up")
        finally:
            await client.aclose()

    anyio.run(up)
    try:
        child = {k: v for k, v in os.environ.items() if k != "STORAGE_EMULATOR_HOST"}
        child.update(
            KUBECONFIG=env["KUBECONFIG"],
            DOCKER_HOST=env["DOCKER_HOST"],
            KINETIC_IMAGE_REGISTRY=env["KINETIC_TESTBED_REGISTRY"],
            KINETIC_BACKEND="gke",
            KINETIC_PROJECT="kt",
            KINETIC_CLUSTER="cdoc",
            KINETIC_NAMESPACE=ns,
            GOOGLE_APPLICATION_CREDENTIALS=env["KUBECONFIG"] + ".absent",
        )
        child.pop("KINETIC_GKE_SERVICE_ACCOUNT", None)
        proc = subprocess.run(
            [sys.executable, "-m", "kinetic", "doctor", "--json", "--timeout", "5"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env=child,
        )
        checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
        account = checks["service-account"]
        assert account["level"] == "ok", account
        assert account["detail"] == f"pods run as {ns}/kinetic, acting as {gsa} (Workload Identity)"
        for name in ("google-service-account", "bucket-access", "registry-access"):
            assert checks[name]["level"] == "warn", checks[name]
            assert checks[name]["detail"].startswith("not checked: no usable Google credentials")
            assert "gcloud auth application-default login" in checks[name]["hint"]
    finally:
        anyio.run(clean)
