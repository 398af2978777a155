"""``kinetic up`` / ``status`` / ``down`` for real on the testbed (``--use-kubeconfig``:
the in-cluster part, which ``up`` does on any Kubernetes cluster).

Each test gets a fresh namespace and bucket name. The testbed's LeaderWorkerSet CRD
exists before every test (labelled ``kinetic-testbed``): ``up`` must find it
pre-existing and ``down`` must leave it, which is the "pre-existing CRD" case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import pytest

from kinetic._backends.gke.client import KubeClient
from kinetic._infra.plan import LWS_CRD_NAME, MANAGED_BY, MANAGED_BY_LABEL, ObjectRef
from tests import fix_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

CRD = ObjectRef("CustomResourceDefinition", LWS_CRD_NAME)


@dataclass(frozen=True)
class Target:
    namespace: str
    bucket: str
    env: dict[str, str]
    kubeconfig: str
    emulator: str

    def kinetic(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        cluster = self.bucket.removeprefix("kt-kn-").removesuffix("-jobs")
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "kinetic",
                "--project",
                "kt",
                "--cluster",
                cluster,
                "--namespace",
                self.namespace,
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
            env={**os.environ, **self.env},
            input=stdin,
        )

    def json_of(self, *args: str) -> dict[str, Any]:
        proc = self.kinetic(*args, "--json")
        assert proc.returncode in (0, 1), proc.stderr
        doc: dict[str, Any] = json.loads(proc.stdout)
        return doc

    # -- looking at the cluster and the bucket with our own client --------------------

    def call(self, method: str, path: str, body: Any = None) -> Any:
        async def go() -> Any:
            client = KubeClient(kubeconfig=self.kubeconfig)
            try:
                return await client._request(method, path, what=f"{method} {path}", body=body)
            finally:
                await client.aclose()

        return anyio.run(go)

    def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self.call("GET", ref.path)
        return found

    def bucket_exists(self) -> bool:
        try:
            urllib.request.urlopen(f"{self.emulator}/storage/v1/b/{self.bucket}", timeout=10)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return False
            raise
        return True

    def make_bucket(self) -> None:
        req = urllib.request.Request(
            f"{self.emulator}/storage/v1/b?project=kt",
            data=json.dumps({"name": self.bucket}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(req, timeout=10).close()


@pytest.fixture
def target(testbed: fix_cluster.Testbed) -> Iterator[Target]:
    env = testbed.env
    t = Target(
        namespace=f"kn-up-{uuid.uuid4().hex[:8]}",
        bucket=f"kt-kn-u{uuid.uuid4().hex[:10]}-jobs",
        env={
            "KUBECONFIG": env["KUBECONFIG"],
            "STORAGE_EMULATOR_HOST": env["STORAGE_EMULATOR_HOST"],
        },
        kubeconfig=env["KUBECONFIG"],
        emulator=env["STORAGE_EMULATOR_HOST"],
    )
    yield t
    # Whatever a failed test left behind (the namespace takes its content along).
    t.call("DELETE", f"/api/v1/namespaces/{t.namespace}")


def refs(ns: str) -> list[ObjectRef]:
    return [
        ObjectRef("Namespace", ns),
        ObjectRef("ServiceAccount", "kinetic", ns),
        ObjectRef("Role", "kinetic", ns),
        ObjectRef("RoleBinding", "kinetic", ns),
        ObjectRef("ConfigMap", "kinetic-setup", ns),
    ]


def versions(t: Target) -> dict[str, str]:
    found = {str(r): t.get(r) for r in [*refs(t.namespace), CRD]}
    return {k: v["metadata"]["resourceVersion"] for k, v in found.items() if v is not None}


def test_up_creates_up_again_changes_nothing_and_down_removes_exactly_that(
    target: Target,
) -> None:
    t, ns = target, target.namespace
    crd_before = t.get(CRD)
    assert crd_before is not None, "the testbed installs the LWS CRD"

    up = t.json_of("up", "--use-kubeconfig")
    results = {o["item"]: o["result"] for o in up["outcomes"]}
    assert results == {
        f"Namespace {ns}": "created",
        f"ServiceAccount {ns}/kinetic": "created",
        f"Role {ns}/kinetic": "created",
        f"RoleBinding {ns}/kinetic": "created",
        f"CustomResourceDefinition {LWS_CRD_NAME}": "pre-existing",
        f"bucket gs://{t.bucket}": "created",
    }
    for ref in refs(ns):
        obj = t.get(ref)
        assert obj is not None, ref
        assert obj["metadata"]["labels"][MANAGED_BY_LABEL] == MANAGED_BY
    binding = t.get(refs(ns)[3])
    assert binding is not None
    assert binding["subjects"][0]["name"] == "kinetic"
    assert t.bucket_exists()

    before = versions(t)
    again = t.json_of("up", "--use-kubeconfig")
    assert {o["result"] for o in again["outcomes"]} == {"kept", "pre-existing"}
    assert versions(t) == before  # nothing was written

    status = t.kinetic("status", "--use-kubeconfig", "--json")
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert doc["ready"]
    managed = {c["component"]: c["managed"] for c in doc["components"]}
    assert managed["lws-crd"] == "pre-existing"
    assert managed["namespace"] == managed["bucket"] == "kinetic up"

    refused = t.kinetic("down", "--use-kubeconfig", stdin="")  # no terminal, no --yes
    assert refused.returncode == 2
    assert "pass --yes" in refused.stderr
    assert f"Namespace {ns} and everything in it" in refused.stderr
    assert versions(t) == before

    down = t.json_of("down", "--use-kubeconfig", "--yes")
    assert {o["result"] for o in down["outcomes"]} == {"deleted"}
    assert [t.get(r) for r in refs(ns)] == [None] * 5  # the namespace is gone, not Terminating
    assert not t.bucket_exists()
    crd_after = t.get(CRD)
    assert crd_after is not None
    assert crd_after["metadata"]["uid"] == crd_before["metadata"]["uid"]
    assert crd_after["metadata"]["labels"][MANAGED_BY_LABEL] == "kinetic-testbed"

    second = t.kinetic("down", "--use-kubeconfig", "--yes")
    assert second.returncode == 0
    assert "nothing to remove" in second.stderr
    missing = t.kinetic("status", "--use-kubeconfig")
    assert missing.returncode == 1
    assert "kinetic up" in missing.stderr


def test_down_leaves_what_existed_before_up_and_what_was_replaced_since(target: Target) -> None:
    t, ns = target, target.namespace
    t.call("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    sa = {"metadata": {"name": "kinetic", "namespace": ns}}
    t.call("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", sa)
    t.make_bucket()

    up = t.json_of("up", "--use-kubeconfig", "--no-lws-crd")
    results = {o["item"]: o["result"] for o in up["outcomes"]}
    assert results == {
        f"Namespace {ns}": "pre-existing",
        f"ServiceAccount {ns}/kinetic": "pre-existing",
        f"Role {ns}/kinetic": "created",
        f"RoleBinding {ns}/kinetic": "created",
        f"bucket gs://{t.bucket}": "pre-existing",
    }
    namespace, account = t.get(refs(ns)[0]), t.get(refs(ns)[1])
    assert namespace is not None
    assert account is not None
    assert MANAGED_BY_LABEL not in (namespace["metadata"].get("labels") or {})  # untouched

    # Someone replaces the Role after `up`: the new one is theirs, not ours.
    role = refs(ns)[2]
    t.call("DELETE", role.path)
    t.call("POST", role.collection, {"metadata": {"name": "kinetic"}, "rules": []})
    replaced = t.get(role)
    assert replaced is not None

    down = t.json_of("down", "--use-kubeconfig", "--yes")
    results = {o["item"]: o["result"] for o in down["outcomes"]}
    assert results == {
        f"RoleBinding {ns}/kinetic": "deleted",
        f"Role {ns}/kinetic": "changed",
        f"ConfigMap {ns}/kinetic-setup": "deleted",
    }
    left = t.get(role)
    assert left is not None
    assert left["metadata"]["uid"] == replaced["metadata"]["uid"]
    assert t.get(refs(ns)[3]) is None
    assert t.get(refs(ns)[4]) is None
    assert t.get(refs(ns)[0]) is not None
    after = t.get(refs(ns)[1])
    assert after is not None
    assert after["metadata"]["uid"] == account["metadata"]["uid"]
    assert t.bucket_exists()


async def test_a_crd_up_creates_is_established_and_down_removes_it(target: Target) -> None:
    """The CRD path for real, with a throw-away CRD in place of the testbed's LWS one."""
    from kinetic._infra import ops
    from kinetic._infra.kube import wait_until
    from kinetic._infra.plan import SetupSpec

    tag = uuid.uuid4().hex[:8]
    group = "kinetic-test.example.com"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"things{tag}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"kind": f"Thing{tag}", "plural": f"things{tag}", "singular": f"thing{tag}"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }
    ref = ObjectRef("CustomResourceDefinition", f"things{tag}.{group}")
    spec = SetupSpec(namespace=target.namespace)
    kube = KubeClient(kubeconfig=target.kubeconfig)
    try:
        done = await ops.set_up(kube, None, spec, lws_crd=crd, timeout=30)
        assert [(o.item, o.result) for o in done][-1] == (str(ref), "created")
        made = await kube.get(ref.path, what="get the CRD")
        assert made["metadata"]["labels"][MANAGED_BY_LABEL] == MANAGED_BY
        conditions = {c["type"]: c["status"] for c in made["status"]["conditions"]}
        assert conditions["Established"] == "True"
        gone = await ops.tear_down(kube, None, target.namespace, timeout=30)
        assert (str(ref), "deleted") in [(o.item, o.result) for o in gone]
        await wait_until(kube, ref, gone=True, timeout=30)  # once its instances are gone
    finally:
        with anyio.CancelScope(shield=True):
            await kube._request("DELETE", ref.path, what="clean up the CRD")
            await kube.aclose()
