"""Pure rules of the pathways backend: backend choice, LWS manifests, group status."""

from __future__ import annotations

from typing import Any

import pytest

from kinetic._core import accelerators, k8s_spec, lws_spec, lws_status
from kinetic._core.status import JobStatus
from kinetic._exceptions import AcceleratorError, ConfigError
from runner import protocol

JOB = "job-1234abcd"


def job_manifest(accel: str = "tpu-v6e-8", **pod: Any) -> dict[str, Any]:
    template = k8s_spec.JobTemplate(
        namespace="ns",
        image="reg/img:t",
        bucket="p-kn-c-jobs",
        accelerator=accelerators.parse_accelerator(accel),
        output_dir=f"gs://p-kn-c-jobs/outputs/{JOB}",
        env={"MY_VAR": "1"},
        pod=k8s_spec.PodOptions(**pod),
    )
    m = k8s_spec.job_manifest(template, JOB)
    return k8s_spec.with_gcs_fuse(m, ["data-bucket"])


def lws(accel: str = "tpu-v6e-8", **pod: Any) -> dict[str, Any]:
    return lws_spec.lws_manifest(
        job_manifest(accel, **pod), accelerator=accelerators.parse_accelerator(accel), version="v1"
    )


def env_of(template: dict[str, Any]) -> dict[str, Any]:
    return {
        e["name"]: e.get("value", e.get("valueFrom"))
        for e in template["spec"]["containers"][0]["env"]
    }


# -- backend choice ------------------------------------------------------------------


def test_unset_backend_sends_multi_host_slices_to_pathways_and_the_rest_to_gke() -> None:
    multi = accelerators.parse_accelerator("tpu-v6e-8")
    assert lws_spec.hosts_of(multi) == 2
    assert lws_spec.choose_backend("gke", multi, explicit=False) == "pathways"
    for single in ("tpu-v5litepod-4", "l4", "cpu"):
        accel = accelerators.parse_accelerator(single)
        assert lws_spec.choose_backend("gke", accel, explicit=False) == "gke"
    # The local backend is left to its own checks.
    assert lws_spec.choose_backend("local", multi, explicit=False) == "local"


def test_explicit_pathways_runs_tpu_slices_single_or_multi_host() -> None:
    for name in ("tpu-v6e-8", "tpu-v5litepod-4"):
        accel = accelerators.parse_accelerator(name)
        assert lws_spec.choose_backend("pathways", accel, explicit=True) == "pathways"


def test_multi_host_slice_on_explicit_gke_is_a_clear_error() -> None:
    accel = accelerators.parse_accelerator("tpu-v5litepod-16")
    with pytest.raises(AcceleratorError, match=r"multi-host TPU slice \(4 hosts\).*pathways"):
        lws_spec.choose_backend("gke", accel, explicit=True)


@pytest.mark.parametrize("name", ["cpu", "cpu:4", "l4", "a100x2"])
def test_pathways_with_cpu_or_gpu_is_a_clear_error(name: str) -> None:
    accel = accelerators.parse_accelerator(name)
    with pytest.raises(AcceleratorError, match="pathways backend runs TPU slices"):
        lws_spec.choose_backend("pathways", accel, explicit=True)


# -- the LeaderWorkerSet ---------------------------------------------------------------


def test_group_of_one_leader_and_workers_sized_by_hosts() -> None:
    m = lws("tpu-v5litepod-16")  # 4x4: 4 hosts of 4 chips
    assert m["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert m["kind"] == "LeaderWorkerSet"
    assert m["metadata"]["name"] == f"kinetic-{JOB}"
    assert m["metadata"]["labels"] == {"app": "kinetic", "job-id": JOB}
    spec = m["spec"]
    assert spec["replicas"] == 1
    group = spec["leaderWorkerTemplate"]
    assert group["size"] == 4
    for template in (group["leaderTemplate"], group["workerTemplate"]):
        container = template["spec"]["containers"][0]
        # Each host claims its own node's chips, not the slice's.
        assert container["resources"]["limits"] == {"google.com/tpu": "4"}
        assert template["spec"]["nodeSelector"] == {
            "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
            "cloud.google.com/gke-tpu-topology": "4x4",
        }
        assert template["metadata"]["labels"]["job-id"] == JOB


def test_nothing_re_runs_a_finished_group() -> None:
    group = lws()["spec"]["leaderWorkerTemplate"]
    # No group recreation on a container restart; StatefulSet pods must say Always
    # (the runner of a restarted container only idles).
    assert group["restartPolicy"] == "None"
    assert group["leaderTemplate"]["spec"]["restartPolicy"] == "Always"
    assert group["workerTemplate"]["spec"]["restartPolicy"] == "Always"


def test_hosts_get_their_index_and_the_coordinator_address() -> None:
    group = lws()["spec"]["leaderWorkerTemplate"]
    leader, worker = env_of(group["leaderTemplate"]), env_of(group["workerTemplate"])
    assert leader[protocol.HOST_ENV] == "0"
    assert worker[protocol.HOST_ENV] == {
        "fieldRef": {"fieldPath": "metadata.labels['leaderworkerset.sigs.k8s.io/worker-index']"}
    }
    names = [f"kinetic-{JOB}-0.kinetic-{JOB}.ns", f"kinetic-{JOB}-0-1.kinetic-{JOB}.ns"]
    for env in (leader, worker):
        assert env["MEGASCALE_COORDINATOR_ADDRESS"] == names[0]
        assert env["TPU_WORKER_HOSTNAMES"] == ",".join(names)


def test_hosts_get_the_same_pod_as_a_gke_job() -> None:
    job = job_manifest(service_account="sa", host_network=True, image_pull_policy="Always")
    m = lws(service_account="sa", host_network=True, image_pull_policy="Always")
    job_pod = job["spec"]["template"]["spec"]
    for template in m["spec"]["leaderWorkerTemplate"].values():
        if not isinstance(template, dict):
            continue
        pod = template["spec"]
        for key in ("tolerations", "volumes", "serviceAccountName", "hostNetwork", "nodeSelector"):
            assert pod[key] == job_pod[key], key
        ours, theirs = pod["containers"][0], job_pod["containers"][0]
        for key in ("image", "command", "resources", "volumeMounts", "imagePullPolicy"):
            assert ours[key] == theirs[key], key
        env = env_of(template)
        for var in theirs["env"]:
            assert env[var["name"]] == var.get("value", var.get("valueFrom"))
        assert template["metadata"]["annotations"] == {"gke-gcsfuse/volumes": "true"}
    # The Job manifest given is not changed.
    assert job == job_manifest(service_account="sa", host_network=True, image_pull_policy="Always")


def test_pod_names_and_host_indexes_follow_the_controller() -> None:
    assert lws_spec.pod_name(JOB, 0) == f"kinetic-{JOB}-0"
    assert lws_spec.pod_name(JOB, 3) == f"kinetic-{JOB}-0-3"
    assert lws_spec.host_of_pod_name(JOB, f"kinetic-{JOB}-0") == 0
    assert lws_spec.host_of_pod_name(JOB, f"kinetic-{JOB}-0-3") == 3
    assert lws_spec.host_of_pod_name(JOB, f"kinetic-{JOB}-1") is None
    assert lws_spec.host_of_pod({"metadata": {"labels": {lws_spec.WORKER_INDEX_LABEL: "2"}}}) == 2
    assert lws_spec.host_of_pod({"metadata": {}}) is None


def test_malformed_job_manifest_is_a_config_error() -> None:
    accel = accelerators.parse_accelerator("tpu-v6e-8")
    with pytest.raises(ConfigError, match="not a Kinetic Job manifest"):
        lws_spec.lws_manifest({"metadata": {}}, accelerator=accel, version="v1")


def test_runner_host_keys_and_index() -> None:
    assert protocol.host_index({}) is None
    assert protocol.host_index({"TPU_WORKER_ID": "3"}) == 3
    with pytest.raises(ValueError, match="TPU_WORKER_ID"):
        protocol.host_index({"TPU_WORKER_ID": "-1"})
    with pytest.raises(ValueError, match="invalid literal"):
        protocol.host_index({"TPU_WORKER_ID": "x"})
    key = protocol.host_final_key(JOB, 2)
    assert key == f"{JOB}/hosts/2/status.json"
    assert protocol.parse_host_key(JOB, key) == (2, "status.json")
    assert protocol.parse_host_key(JOB, f"{JOB}/status.json") is None


# -- status of the group -----------------------------------------------------------------


def pod(host: int, *, state: dict[str, Any] | None = None, last: dict[str, Any] | None = None,
        phase: str = "Running", restarts: int = 0, **status: Any) -> dict[str, Any]:  # fmt: skip
    container: dict[str, Any] = {"state": state or {"running": {}}, "restartCount": restarts}
    if last is not None:
        container["lastState"] = last
    return {
        "metadata": {
            "name": lws_spec.pod_name(JOB, host),
            "labels": {lws_spec.WORKER_INDEX_LABEL: str(host), "job-id": JOB},
        },
        "status": {"phase": phase, "containerStatuses": [container], **status},
    }


def ended(code: int, **extra: Any) -> dict[str, Any]:
    return {"terminated": {"exitCode": code, **extra}}


OK = {"state": "succeeded", "phase": None, "error": None, "error_type": None}


def failed(error: str, phase: str = "execute") -> dict[str, Any]:
    return {"state": "failed", "phase": phase, "error": error, "error_type": "builtins.X"}


def group(**kw: Any) -> lws_status.GroupReport:
    args: dict[str, Any] = {
        "hosts": 2,
        "final": None,
        "cancelled": False,
        "host_finals": {},
        "lws_exists": True,
        "pods": [],
    }
    args.update(kw)
    return lws_status.status_from_group(**args)


def test_all_hosts_succeeded_gives_host_zeros_value() -> None:
    pods = [pod(0, last=ended(0), restarts=1), pod(1, last=ended(0), restarts=1)]
    g = group(host_finals={0: OK, 1: OK}, pods=pods)
    assert g.report.status is JobStatus.SUCCEEDED
    assert g.result_host == 0
    assert lws_status.job_final(g) == {**OK, "host": 0}


def test_worker_failure_fails_the_job_while_the_leader_runs() -> None:
    pods = [pod(0), pod(1, last=ended(1), restarts=1)]
    assert lws_status.needs_records(pods, lws_exists=True)
    g = group(host_finals={1: failed("ValueError: worker boom")}, pods=pods)
    assert g.report.status is JobStatus.FAILED
    assert g.report.reason == "host 1 failed in phase execute: ValueError: worker boom"
    assert g.report.phase == "execute"
    assert g.result_host == 1
    assert g.failed_hosts == (1,)
    record = lws_status.job_final(g)
    assert record is not None
    assert record["host"] == 1


def test_other_failing_hosts_are_named_and_the_recorded_failure_decides() -> None:
    pods = [
        pod(0, state=ended(137, reason="OOMKilled")),
        pod(1),
        pod(2, last=ended(1), restarts=1),
        pod(3, last=ended(0), restarts=1),
    ]
    g = group(hosts=4, host_finals={2: failed("KeyError: 'x'"), 3: OK}, pods=pods)
    assert g.report.status is JobStatus.FAILED
    assert g.result_host == 2
    assert g.failed_hosts == (2, 0)
    assert g.report.reason is not None
    assert g.report.reason.startswith("host 2 failed in phase execute: KeyError: 'x'")
    assert "other failing hosts: host 0: the container was killed: out of memory" in g.report.reason


def test_a_success_whose_pod_failed_never_returns_a_value() -> None:
    pods = [pod(0, last=ended(2), restarts=1), pod(1, last=ended(0), restarts=1)]
    g = group(host_finals={0: OK, 1: OK}, pods=pods)
    assert g.report.status is JobStatus.FAILED
    assert g.report.reason is not None
    assert "host 0: the runner process exited with status 2" in g.report.reason
    assert "after it recorded success" in g.report.reason
    assert g.result_host is None
    record = lws_status.job_final(g)
    assert record is not None
    assert record["host"] is None


def test_runner_ending_without_a_record_or_a_deleted_pod_fail_the_job() -> None:
    g = group(pods=[pod(0), pod(1, last=ended(0), restarts=1)])
    assert g.report.status is JobStatus.FAILED
    assert g.report.reason == "host 1: the runner ended without recording an outcome"
    g = group(pods=[pod(0)], lost={1: f"kinetic-{JOB}-0-1"})
    assert g.report.reason == f"host 1: pod kinetic-{JOB}-0-1 was deleted before the host finished"
    assert g.result_host is None


def test_running_pending_and_cannot_start() -> None:
    assert group(pods=[pod(0), pod(1)]).report.status is JobStatus.RUNNING
    assert not lws_status.needs_records([pod(0), pod(1)], lws_exists=True)
    # Host 0 finished, host 1 still runs.
    g = group(host_finals={0: OK}, pods=[pod(0, last=ended(0), restarts=1), pod(1)])
    assert g.report.status is JobStatus.RUNNING
    stuck = pod(
        1,
        state={"waiting": {"reason": "ContainerCreating"}},
        phase="Pending",
        conditions=[
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "x"}
        ],
    )
    g = group(pods=[pod(0), stuck])
    assert g.report.status is JobStatus.PENDING
    assert g.report.reason == "host 1: unschedulable: no node can run it (x)"
    # An LWS whose controller made no pods: pending, with a reason once judged late.
    assert group().report == lws_status.StatusReport(JobStatus.PENDING)
    late = group(podless_reason="no pods")
    assert late.report.reason == "no pods"


def test_records_and_absence() -> None:
    g = group(final={**OK, "host": 0})
    assert (g.report.status, g.result_host) == (JobStatus.SUCCEEDED, 0)
    record = {**failed("host 1 failed"), "host": 1, "failed_hosts": [1, 0]}
    g = group(final=record)
    assert (g.report.status, g.result_host, g.failed_hosts) == (JobStatus.FAILED, 1, (1, 0))
    g = group(cancelled=True, pods=[pod(0)])
    assert g.report.cancelled
    assert lws_status.job_final(g) is None
    g = group(lws_exists=False)
    assert g.report.status is JobStatus.FAILED
    assert group(lws_exists=False, recorded=False).report.status is JobStatus.NOT_FOUND
    g = group(lws_exists=False, pods=[pod(0), pod(1)])
    assert g.report.reason == "its LeaderWorkerSet was deleted before every host finished"


def test_a_failed_payload_is_annotated_with_the_other_failing_hosts() -> None:
    import cloudpickle

    from kinetic._backends.pathways.backend import _annotate

    payload = protocol.result_payload(success=False, exception=ValueError("boom"), error="x")
    out = cloudpickle.loads(_annotate(cloudpickle.dumps(payload), "hosts 1, 2 failed"))
    assert out["exception"].__notes__ == ["hosts 1, 2 failed"]
    payload = protocol.result_payload(success=False, error="SystemExit: 3")
    out = cloudpickle.loads(_annotate(cloudpickle.dumps(payload), "hosts 1, 2 failed"))
    assert out["error"] == "SystemExit: 3 (hosts 1, 2 failed)"
    assert _annotate(b"not a pickle", "note") == b"not a pickle"
