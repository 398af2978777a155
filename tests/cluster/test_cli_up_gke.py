"""``kinetic up`` / ``status`` / ``down`` on GKE, through the command line, in process:
Kinetic's own clients, with the Google APIs that have no emulator (Container,
IAM, Artifact Registry, Resource Manager, bucket IAM) served by their stateful
fakes on loopback (each on a thread of its own: the CLI runs its own loops), and the
cluster's in-cluster part on the testbed's real Kubernetes (the session hands the
Kubernetes client the testbed's kubeconfig instead of one made from the fake cluster's
endpoint). The jobs bucket itself is fake-gcs-server's.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from kinetic._backends.gke.client import KubeClient
from kinetic._cli import infra, main
from kinetic._infra.container import ContainerClient
from kinetic._infra.google_rest import GoogleRest
from kinetic._infra.identity import WI_ANNOTATION, WI_ROLE
from tests import fix_cluster
from tests.fix_google import PROJECT_NUMBER, FakeGoogle
from tests.loopback_http import serve_in_thread
from tests.unit.test_infra_gke_rest import FakeGKE

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

REPO = "projects/p/locations/z/repositories/kinetic"


class World:
    def __init__(self, testbed: fix_cluster.Testbed, namespace: str) -> None:
        self.gke = FakeGKE(polls=1)
        self.google = FakeGoogle(project="p")
        self.google.buckets.add("p-kn-c-jobs")
        self.kubeconfig = testbed.env["KUBECONFIG"]
        self.namespace = namespace
        self.gsa = f"kn-c-{namespace}@p.iam.gserviceaccount.com"

    def cli(self, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any]:
        code = main(
            ["--project", "p", "--zone", "z", "--cluster", "c", "--namespace", self.namespace]
            + list(args)
        )
        out = capsys.readouterr().out
        return code, json.loads(out) if out.strip() else None

    def kube_get(self, path: str) -> Any:
        async def go() -> Any:
            client = KubeClient(kubeconfig=self.kubeconfig)
            try:
                return await client.get(path, what=f"get {path}")
            finally:
                await client.aclose()

        return anyio.run(go)


@pytest.fixture
def world(testbed: fix_cluster.Testbed, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    env = testbed.env
    monkeypatch.setenv("KUBECONFIG", env["KUBECONFIG"])
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", env["STORAGE_EMULATOR_HOST"])
    monkeypatch.delenv("KINETIC_GKE_SERVICE_ACCOUNT", raising=False)
    w = World(testbed, f"kn-gke-{uuid.uuid4().hex[:8]}")

    async def token(self: Any) -> str:
        return "t0ken"

    async def container(self: Any) -> ContainerClient:
        client = ContainerClient(
            self.token,
            project="p",
            location="z",
            base_url=gke_url,
            backoff=0.001,
            poll_interval=0.001,
        )
        self._stack.push_async_callback(client.aclose)
        return client

    def rest(self: Any) -> GoogleRest:
        if self._rest is None:
            self._rest = GoogleRest(
                self.token, roots=google_roots, backoff=0.001, poll_interval=0.001
            )
            self._stack.push_async_callback(self._rest.aclose)
        made: GoogleRest = self._rest
        return made

    async def kube(self: Any, cluster: Any = None) -> KubeClient:
        client = KubeClient(kubeconfig=w.kubeconfig, attempts=3, backoff=0.2)
        self._stack.push_async_callback(client.aclose)
        return client

    for name, fn in (("token", token), ("container", container), ("rest", rest), ("kube", kube)):
        monkeypatch.setattr(infra._Session, name, fn)
    with serve_in_thread(w.gke.handle) as gke, w.google.serve_in_thread() as google_roots:
        gke_url = gke.url
        yield w

    async def clean() -> None:
        client = KubeClient(kubeconfig=w.kubeconfig)
        try:
            await client._request("DELETE", f"/api/v1/namespaces/{w.namespace}", what="clean")
        finally:
            await client.aclose()

    anyio.run(clean)


def test_up_makes_the_google_side_status_shows_it_and_down_keeping_the_cluster_removes_it(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    w, g = world, world.google
    code, up = w.cli(capsys, "up", "--no-lws-crd", "--json")
    assert code == 0
    results = {o["item"]: o["result"] for o in up["outcomes"]}
    compute = f"serviceAccount:{PROJECT_NUMBER}-compute@developer.gserviceaccount.com"
    assert results["GKE cluster c"] == "created"
    assert results["Artifact Registry repository z-docker.pkg.dev/p/kinetic"] == "created"
    assert results[f"Google service account {w.gsa}"] == "created"
    assert results[f"ServiceAccount {w.namespace}/kinetic"] == "created"
    assert sum(k.startswith("IAM grant") and v == "created" for k, v in results.items()) == 4
    # The pods' identity: the annotation, the Workload Identity grant, the accesses.
    account = w.kube_get(f"/api/v1/namespaces/{w.namespace}/serviceaccounts/kinetic")
    assert account["metadata"]["annotations"][WI_ANNOTATION] == w.gsa
    wi = g.members(f"projects/p/serviceAccounts/{w.gsa}", WI_ROLE)
    assert wi == [f"serviceAccount:p.svc.id.goog[{w.namespace}/kinetic]"]
    assert g.members("p-kn-c-jobs", "roles/storage.objectUser") == [f"serviceAccount:{w.gsa}"]
    assert g.members(REPO, "roles/artifactregistry.reader") == [
        f"serviceAccount:{w.gsa}",
        compute,  # the default node pool's account pulls the images
    ]

    code, status = w.cli(capsys, "status", "--json")
    assert code == 0, status
    assert status["ready"]
    rows = {c["component"]: c for c in status["components"]}
    assert rows["repository"]["managed"] == "kinetic up"
    assert rows["google-service-account"]["name"] == w.gsa
    assert rows["service-account"]["detail"] == f"acts as {w.gsa} (Workload Identity)"

    code, again = w.cli(capsys, "up", "--no-lws-crd", "--json")
    assert code == 0
    assert {o["result"] for o in again["outcomes"]} <= {"kept", "pre-existing"}

    code, down = w.cli(capsys, "down", "--keep-cluster", "--yes", "--json")
    assert code == 0
    assert {o["result"] for o in down["outcomes"]} == {"deleted"}
    assert g.repositories == {}
    assert g.accounts == {}
    assert g.members("p-kn-c-jobs", "roles/storage.objectUser") == []
    assert "c" in w.gke.clusters  # kept


def test_down_deleting_the_cluster_removes_the_google_side_too(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    w, g = world, world.google
    g.add_repository(REPO)  # made by someone else: left alone
    code, _ = w.cli(capsys, "up", "--no-lws-crd", "--json")
    assert code == 0
    code, down = w.cli(capsys, "down", "--yes", "--json")
    assert code == 0
    results = {o["item"]: o["result"] for o in down["outcomes"]}
    assert results["GKE cluster c"] == "deleted"
    assert results[f"Google service account {w.gsa}"] == "deleted"
    assert f"Artifact Registry repository {REPO}" not in results
    assert REPO in g.repositories
    assert g.members(REPO, "roles/artifactregistry.reader") == []  # our grants revoked
    assert g.accounts == {}
    assert w.gke.clusters == {}
