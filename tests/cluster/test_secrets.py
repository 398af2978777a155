"""``secrets=`` on a real Kubernetes: a Secret made through the API server reaches the
job's pod as variables and as files, and its value is in no bucket object and no Job
manifest; a missing Secret fails the job, naming it and its namespace."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets as token
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

import kinetic
from kinetic._backends.gke.client import KubeClient
from tests.fix_cluster import GKETarget

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

MOUNT = "/etc/kt-certs"


def kube(gke: GKETarget, method: str, path: str, body: Any = None) -> Any:
    """One request to the testbed's API server, with Kinetic's own client."""

    async def go() -> Any:
        client = KubeClient(kubeconfig=gke.testbed.env["KUBECONFIG"])
        try:
            return await client._request(method, path, what=f"{method} {path}", body=body)
        finally:
            await client.aclose()

    return anyio.run(go)


class Secrets:
    """Secrets made for one test, with names of their own (the testbed is shared);
    deleted when the test ends, however it ends."""

    def __init__(self, gke: GKETarget) -> None:
        self.gke = gke
        self.made: list[str] = []
        self.tag = uuid.uuid4().hex[:8]

    def name(self, what: str) -> str:
        return f"kt-{what}-{self.tag}"

    def create(self, what: str, data: dict[str, str]) -> str:
        name = self.name(what)
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name},
            "type": "Opaque",
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        }
        kube(self.gke, "POST", f"/api/v1/namespaces/{self.gke.namespace}/secrets", body)
        self.made.append(name)
        return name

    def delete_all(self) -> None:
        for name in self.made:
            kube(self.gke, "DELETE", f"/api/v1/namespaces/{self.gke.namespace}/secrets/{name}")


START_GRACE = "40"
"""Seconds a job may be unable to start: the shared testbed's node may be busy with
other sessions' pods for a while (the tier's 4 s would fail the job as unschedulable)."""


@pytest.fixture
def k8s_secrets(gke: GKETarget, monkeypatch: pytest.MonkeyPatch) -> Iterator[Secrets]:
    monkeypatch.setenv("KINETIC_GKE_START_GRACE", START_GRACE)
    made = Secrets(gke)
    try:
        yield made
    finally:
        made.delete_all()


def bucket_bytes(gke: GKETarget) -> dict[str, bytes]:
    """Every object of the test's bucket, read back from the emulator."""
    out = {}
    for name in gke.object_names():
        quoted = urllib.parse.quote(name, safe="")
        url = f"{gke.emulator}/storage/v1/b/{gke.bucket}/o/{quoted}?alt=media"
        with urllib.request.urlopen(url, timeout=10) as resp:
            out[name] = resp.read()
    return out


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def reads_its_secrets() -> dict[str, Any]:
    # Digests only: a value in the result would rest in the bucket (result.pkl).
    import hashlib
    import os

    def d(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    crt = os.path.join(MOUNT, "tls.crt")
    with open(crt, "rb") as f:
        content = f.read()
    return {
        "DB_PASSWORD": d(os.environ["DB_PASSWORD"].encode()),
        "API_TOKEN": d(os.environ["API_TOKEN"].encode()),
        "file": d(content),
        "mode": oct(os.stat(crt).st_mode & 0o777),
        "files": sorted(n for n in os.listdir(MOUNT) if not n.startswith("..")),
    }


def test_a_job_reads_a_secret_as_variables_and_files_and_no_value_rests_anywhere(
    gke: GKETarget, k8s_secrets: Secrets
) -> None:
    password, cert, api = (token.token_hex(16) for _ in range(3))
    db = k8s_secrets.create("db", {"password": password, "tls.crt": cert})
    whole = k8s_secrets.create("api", {"API_TOKEN": api})
    fn = kinetic.run(
        **gke.run_args(),
        secrets=[
            kinetic.Secret(db, keys={"password": "DB_PASSWORD"}),
            kinetic.Secret(db, mount=MOUNT),
            whole,
        ],
    )(reads_its_secrets)
    job = fn.run_async()
    assert job.result(timeout=180, cleanup=False) == {
        "DB_PASSWORD": digest(password),
        "API_TOKEN": digest(api),
        "file": digest(cert),
        "mode": "0o400",
        "files": ["password", "tls.crt"],
    }
    manifest = kube(gke, "GET", f"/apis/batch/v1/namespaces/{gke.namespace}/jobs/{job.k8s_name}")
    pods = kube(
        gke, "GET", f"/api/v1/namespaces/{gke.namespace}/pods?labelSelector=job-id%3D{job.job_id}"
    )
    objects = bucket_bytes(gke)
    assert f"{job.job_id}/spec.json" in objects
    assert "secrets" not in json.loads(objects[f"{job.job_id}/spec.json"])  # a pod's: Kubernetes
    for value in (password, cert, api):
        for encoded in (value, base64.b64encode(value.encode()).decode()):
            assert encoded not in json.dumps(manifest)
            assert encoded not in json.dumps(pods)
            for name, data in objects.items():
                assert encoded.encode() not in data, f"a secret's value rests in {name}"
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"] == [{"secretRef": {"name": whole}}]
    job.cleanup()


def test_a_batch_records_references_only(gke: GKETarget, k8s_secrets: Secrets) -> None:
    value = token.token_hex(16)
    name = k8s_secrets.create("batch", {"token": value})

    def sees(_: int) -> str:
        import hashlib
        import os

        return hashlib.sha256(os.environ["CI_TOKEN"].encode()).hexdigest()

    fn = kinetic.run(**gke.run_args(), secrets=[kinetic.Secret(name, keys={"token": "CI_TOKEN"})])
    batch = fn(sees).run_async_map([1, 2])
    got = batch.results(timeout=180, cleanup=False, return_exceptions=True)
    assert got == [digest(value)] * 2, got
    objects = bucket_bytes(gke)
    manifest = json.loads(objects[f"_groups/{batch.group_id}/manifest.json"])
    assert manifest["gke"]["secrets"] == [{"name": name, "keys": {"token": "CI_TOKEN"}}]
    for key, data in objects.items():
        assert value.encode() not in data, f"the value rests in {key}"
    batch.cleanup()


def test_a_missing_secret_fails_the_job_naming_it(gke: GKETarget, k8s_secrets: Secrets) -> None:
    absent = k8s_secrets.name("absent")  # never made
    as_variable = kinetic.run(**gke.run_args(), secrets=[absent])(digest)
    job = as_variable.run_async("x")
    with pytest.raises(kinetic.JobFailedError) as failed:
        job.result(timeout=120)
    said = str(failed.value)
    assert f"the Secret {absent!r} does not exist in namespace {gke.namespace!r}" in said

    as_files = kinetic.run(**gke.run_args(), secrets=[kinetic.Secret(absent, mount=MOUNT)])
    job = as_files(digest).run_async("x")
    with pytest.raises(kinetic.JobFailedError) as failed:
        job.result(timeout=120)
    assert failed.value.phase == "secrets"
    assert f"the Secret {absent!r} does not exist in namespace {gke.namespace!r}" in str(
        failed.value
    )
