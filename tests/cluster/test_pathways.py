"""The pathways backend on a real Kubernetes (the testbed): LeaderWorkerSets, real pods.

The testbed installs a LeaderWorkerSet CRD (kinetic/_infra/lws-crd.json) but no LWS
controller exists for Kubernetes 1.20, so :class:`GroupController` stands in for it:
for every LWS of the test's bucket it creates the group's pods the way the controller
does (names ``{lws}-0`` and ``{lws}-0-{i}``, the LWS labels and annotations, the
``LWS_*`` variables, owned by the LWS), from the templates the apiserver stored. One
adaptation to the testbed: its single node is shaped as a v5e 2x2 host, so the
stand-in drops the slice's TPU node selector and ``google.com/tpu`` requests (the
tests check them on the stored LWS instead) so that both hosts run on it.

With an external cluster (``KINETIC_TESTBED_KUBECONFIG``) a real LWS controller is
expected, and the stand-in stays out of the way.
"""

from __future__ import annotations

import copy
import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any, Self

import anyio
import pytest

import kinetic
from kinetic import JobStatus
from kinetic._backends.cluster import Cluster
from kinetic._backends.gke.client import KubeClient
from kinetic._backends.pathways.api import forget_versions
from kinetic._backends.pathways.backend import PathwaysBackend
from kinetic._core import lws_spec
from kinetic._exceptions import AcceleratorError, ConfigError
from tests import sync_http
from tests.fix_cluster import GKETarget
from tests.sync_http import SyncHttp

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

LWS_API = "/apis/leaderworkerset.x-k8s.io/v1"
MULTI_HOST = "tpu-v6e-8"
"""A 2x4 v6e slice: 2 hosts of 4 chips."""


class GroupController:
    """Creates the pods of the test bucket's LeaderWorkerSets, as the LWS controller would."""

    def __init__(self, target: GKETarget) -> None:
        env = target.testbed.env
        self.enabled = env.get("KINETIC_TESTBED_MODE") == "local"
        self.bucket = target.bucket
        self.namespace = target.namespace
        self.http = SyncHttp(
            env.get("KINETIC_TESTBED_API_SERVER", "https://127.0.0.1:6443"),
            headers={"Authorization": f"Bearer {env.get('KINETIC_TESTBED_TOKEN', '')}"},
            verify=False,
            timeout=10,
        )
        self.created: dict[str, list[str]] = {}
        self.seen: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lws-stand-in", daemon=True)

    def __enter__(self) -> Self:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def lws(self, name: str) -> dict[str, Any] | None:
        resp = self.http.get(f"{LWS_API}/namespaces/{self.namespace}/leaderworkersets/{name}")
        return resp.json() if resp.status_code == 200 else None

    def pods(self, job_id: str) -> list[dict[str, Any]]:
        resp = self.http.get(
            f"/api/v1/namespaces/{self.namespace}/pods",
            params={"labelSelector": f"job-id={job_id}"},
        )
        resp.raise_for_status()
        return list(resp.json()["items"])

    def _ours(self, lws: dict[str, Any]) -> bool:
        leader = lws["spec"]["leaderWorkerTemplate"].get("leaderTemplate") or {}
        env = leader.get("spec", {}).get("containers", [{}])[0].get("env") or []
        return any(e.get("name") == "KINETIC_BUCKET" and e.get("value") == self.bucket for e in env)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                resp = self.http.get(f"{LWS_API}/namespaces/{self.namespace}/leaderworkersets")
                for lws in resp.json().get("items") or []:
                    name = lws["metadata"]["name"]
                    if (
                        name not in self.created
                        and not lws["metadata"].get("deletionTimestamp")
                        and self._ours(lws)
                    ):
                        self.seen[name] = lws
                        self.created[name] = [self._create_pod(lws, i) for i in range(_size(lws))]
            except (*sync_http.Errors, KeyError, ValueError) as exc:  # keep standing in
                print(f"lws stand-in: {exc}")
            self._stop.wait(0.2)

    def _create_pod(self, lws: dict[str, Any], host: int) -> str:
        meta, group = lws["metadata"], lws["spec"]["leaderWorkerTemplate"]
        name = meta["name"]
        key = "leaderTemplate" if host == 0 and group.get("leaderTemplate") else "workerTemplate"
        template = copy.deepcopy(group[key])
        pod_name = f"{name}-0" if host == 0 else f"{name}-0-{host}"
        labels = {
            **(template.get("metadata", {}).get("labels") or {}),
            lws_spec.NAME_LABEL: name,
            lws_spec.GROUP_INDEX_LABEL: "0",
            lws_spec.WORKER_INDEX_LABEL: str(host),
            lws_spec.GROUP_KEY_LABEL: meta["uid"].replace("-", "")[:40],
        }
        annotations = {
            **(template.get("metadata", {}).get("annotations") or {}),
            "leaderworkerset.sigs.k8s.io/size": str(_size(lws)),
        }
        if host:
            annotations["leaderworkerset.sigs.k8s.io/leader-name"] = f"{name}-0"
        spec = template["spec"]
        spec.pop("nodeSelector", None)  # the testbed adaptation (module docstring)
        for container in spec["containers"]:
            container.get("resources", {}).get("limits", {}).pop("google.com/tpu", None)
            container.get("resources", {}).get("requests", {}).pop("google.com/tpu", None)
            container["env"] = [
                {"name": "LWS_LEADER_ADDRESS", "value": f"{name}-0.{name}.{meta['namespace']}"},
                {"name": "LWS_GROUP_SIZE", "value": str(_size(lws))},
                {"name": "LWS_WORKER_INDEX", "value": str(host)},
                *(container.get("env") or []),
            ]
        spec.setdefault("hostname", pod_name)
        spec.setdefault("subdomain", name)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": meta["namespace"],
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [
                    {
                        "apiVersion": lws["apiVersion"],
                        "kind": "LeaderWorkerSet",
                        "name": name,
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
        }
        resp = self.http.post(f"/api/v1/namespaces/{meta['namespace']}/pods", json=pod)
        if resp.status_code not in (201, 409):
            raise AssertionError(f"the apiserver refused host {host}'s pod: {resp.text}")
        return pod_name


def _size(lws: dict[str, Any]) -> int:
    return int(lws["spec"]["leaderWorkerTemplate"].get("size") or 1)


@pytest.fixture
def group_controller(gke: GKETarget) -> Iterator[GroupController]:
    with GroupController(gke) as controller:
        yield controller


def wait_for(predicate, timeout: float = 60.0, every: float = 0.2):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"condition not met within {timeout}s")


def host_facts() -> dict[str, str]:
    keys = ("TPU_WORKER_ID", "MEGASCALE_COORDINATOR_ADDRESS", "TPU_WORKER_HOSTNAMES", "JOB_ID")
    print(f"host {os.environ.get('TPU_WORKER_ID')} here", flush=True)
    return {k: os.environ.get(k, "") for k in keys}


def worker_fails(seconds: float) -> str:
    if os.environ["TPU_WORKER_ID"] == "1":
        raise ValueError("worker boom")
    time.sleep(seconds)
    return "leader done"


def sleeper(seconds: float) -> str:
    time.sleep(seconds)
    return "slept"


def test_unset_backend_runs_a_multi_host_slice_as_an_lws_and_returns_host_zeros_value(
    gke: GKETarget, group_controller: GroupController
) -> None:
    args = gke.run_args(accelerator=MULTI_HOST)
    del args["backend"]  # a project is set: multi-host slices go to pathways by themselves
    job = kinetic.run(**args)(host_facts).run_async()
    assert job.backend == "pathways"
    assert job.k8s_name == f"kinetic-{job.job_id}"
    facts = job.result(timeout=180, cleanup=False)
    names = lws_spec.host_dns_names(job.job_id, gke.namespace, 2)
    assert facts == {
        "TPU_WORKER_ID": "0",
        "MEGASCALE_COORDINATOR_ADDRESS": names[0],
        "TPU_WORKER_HOSTNAMES": ",".join(names),
        "JOB_ID": job.job_id,
    }
    # Both hosts ran and recorded their own outcome.
    for host in (0, 1):
        assert f"{job.job_id}/hosts/{host}/status.json" in gke.object_names(f"{job.job_id}/")
    assert job.status() is JobStatus.SUCCEEDED
    if group_controller.enabled:
        # The apiserver stored the spec as sent: one group of 2 hosts with 4 chips each.
        stored = group_controller.seen[job.k8s_name]
        group = stored["spec"]["leaderWorkerTemplate"]
        assert (group["size"], group["restartPolicy"]) == (2, "None")
        for key in ("leaderTemplate", "workerTemplate"):
            pod_spec = group[key]["spec"]
            assert pod_spec["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"] == (
                "tpu-v6e-slice"
            )
            limits = pod_spec["containers"][0]["resources"]["limits"]
            assert limits == {"google.com/tpu": "4"}
        assert group_controller.created[job.k8s_name] == [
            f"{job.k8s_name}-0",
            f"{job.k8s_name}-0-1",
        ]
    # The job ended: its LWS (no TTL) and its idle hosts are gone.
    wait_for(lambda: group_controller.lws(job.k8s_name) is None, timeout=30)
    wait_for(lambda: not group_controller.pods(job.job_id), timeout=60)
    assert "host 0 here" in job.logs()  # the leader's output, from storage now
    assert "host 1 here" not in job.logs()
    job.cleanup()
    assert gke.object_names(f"{job.job_id}/") == []


def test_blocking_call_streams_the_leaders_output(
    gke: GKETarget, group_controller: GroupController, capsys: pytest.CaptureFixture[str]
) -> None:
    fn = kinetic.run(**gke.run_args(accelerator=MULTI_HOST, backend="pathways"))(host_facts)
    assert fn()["TPU_WORKER_ID"] == "0"
    out = capsys.readouterr().out
    assert out.count("host 0 here") == 1
    assert "host 1 here" not in out


def test_a_failing_worker_fails_the_job_promptly_with_its_exception(
    gke: GKETarget, group_controller: GroupController
) -> None:
    job = kinetic.run(**gke.run_args(accelerator=MULTI_HOST, backend="pathways"))(
        worker_fails
    ).run_async(240)
    started = time.monotonic()
    with pytest.raises(ValueError, match="worker boom") as info:
        job.result(timeout=200, cleanup=False)
    assert time.monotonic() - started < 150  # the leader still had minutes to sleep
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "Remote traceback" in notes
    report = job.status_report()
    assert report.status is JobStatus.FAILED
    assert report.reason is not None
    assert report.reason.startswith("host 1 failed in phase execute: ValueError: worker boom")
    wait_for(lambda: group_controller.lws(job.k8s_name) is None, timeout=30)
    job.cleanup()


def test_cancel_deletes_the_lws_and_its_pods(
    gke: GKETarget, group_controller: GroupController
) -> None:
    job = kinetic.run(**gke.run_args(accelerator=MULTI_HOST, backend="pathways"))(
        sleeper
    ).run_async(240)
    wait_for(lambda: job.status() is JobStatus.RUNNING, timeout=120)
    assert len(group_controller.pods(job.job_id)) == 2
    job.cancel()
    wait_for(lambda: group_controller.lws(job.k8s_name) is None, timeout=30)
    wait_for(lambda: not group_controller.pods(job.job_id), timeout=60)
    report = job.status_report()
    assert report.status is JobStatus.FAILED
    assert report.cancelled
    with pytest.raises(kinetic.JobCancelledError):
        job.result(timeout=30)


def test_bad_input_is_refused_before_anything_is_written(gke: GKETarget) -> None:
    def nothing() -> None:
        return None

    with pytest.raises(AcceleratorError, match=r"multi-host TPU slice \(2 hosts\)"):
        kinetic.run(**gke.run_args(accelerator=MULTI_HOST, backend="gke"))(nothing).run_async()
    with pytest.raises(AcceleratorError, match="pathways backend runs TPU slices"):
        kinetic.run(**gke.run_args(accelerator="cpu", backend="pathways"))(nothing).run_async()
    assert gke.object_names() == []


def test_a_cluster_without_the_crd_is_a_clear_error(gke: GKETarget) -> None:
    async def attempt() -> tuple[str, str]:
        forget_versions()
        cluster = Cluster(KubeClient())
        backend = PathwaysBackend(
            gke.bucket, cluster, namespace=gke.namespace, group="leaderworkerset.missing.example"
        )
        try:
            with pytest.raises(ConfigError) as discovery:
                await backend.check_cluster()
            with pytest.raises(ConfigError) as listing:
                await backend.list_job_ids()
            return str(discovery.value), str(listing.value)
        finally:
            await backend.aclose()
            await cluster.aclose()

    for message in anyio.run(attempt):
        assert "does not serve LeaderWorkerSets (leaderworkerset.missing.example)" in message
        assert "kubectl apply --server-side -f" in message


def test_the_real_group_is_discovered_once_per_process(gke: GKETarget) -> None:
    async def discover() -> tuple[str, int]:
        forget_versions()
        client = KubeClient()
        backend = PathwaysBackend(gke.bucket, Cluster(client), namespace=gke.namespace)
        try:
            assert await backend.lws.version() == "v1"
            before = client.requests_sent
            for _ in range(3):
                await backend.lws.version()
            return json.dumps(await backend.lws.list(gke.namespace, "app=none")), (
                client.requests_sent - before
            )
        finally:
            await backend.aclose()
            await client.aclose()

    listing, extra = anyio.run(discover)
    assert listing == "[]"
    assert extra == 1  # the list; no further discovery
