"""The GKE backend on a real Kubernetes (the testbed): public API, real pods.

Every test submits through ``kinetic.run(backend="gke", ...)`` with the runner
image built by Kinetic's own builder; pods pull it from the local registry, run
the runner, and write to fake-gcs-server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import pytest

import kinetic
from kinetic import JobStatus
from tests.fix_cluster import GKETarget, run_python
from tests.sync_http import SyncHttp

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


def wait_for(predicate, timeout: float = 60.0, every: float = 0.2):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"condition not met within {timeout}s")


def square(x: int) -> int:
    print(f"squaring {x}", flush=True)
    return x * x


def boom() -> None:
    raise KeyError("remote boom")


def chatty(n: int, pause: float) -> str:
    for i in range(n):
        print(f"line {i}", flush=True)
        time.sleep(pause)
    return "done"


def sleeper(seconds: float) -> str:
    time.sleep(seconds)
    return "slept"


def platform_env() -> dict[str, str]:
    return {k: os.environ.get(k, "") for k in ("JAX_PLATFORMS", "JOB_ID", "KINETIC_OUTPUT_DIR")}


def test_value_round_trip_and_handle_fields(gke: GKETarget) -> None:
    fn = kinetic.run(**gke.run_args())(square)
    job = fn.run_async(7)
    assert job.backend == "gke"
    assert job.bucket_name == gke.bucket
    assert job.cluster_name == gke.cluster
    assert job.k8s_name == f"kinetic-{job.job_id}"
    assert job.image_uri == gke.image
    assert job.result(timeout=120) == 49
    # cleanup=True (default): the job's objects are gone.
    assert gke.object_names(f"{job.job_id}/") == []


def test_blocking_call_streams_logs(gke: GKETarget, capsys: pytest.CaptureFixture[str]) -> None:
    fn = kinetic.run(**gke.run_args())(square)
    assert fn(5) == 25


def test_user_exception_is_reraised_with_remote_traceback(gke: GKETarget) -> None:
    job = kinetic.run(**gke.run_args())(boom).run_async()
    with pytest.raises(KeyError, match="remote boom") as info:
        job.result(timeout=120)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "Remote traceback" in notes
    assert "boom" in notes


def test_logs_follow_from_start_then_from_storage_after_pod_is_gone(gke: GKETarget) -> None:
    job = kinetic.run(**gke.run_args())(chatty).run_async(5, 0.3)
    text = "".join(job.iter_logs())  # from the first container start until it ends
    assert [f"line {i}" for i in range(5)] == [
        ln for ln in text.splitlines() if ln.startswith("line")
    ]
    assert job.result(timeout=60, cleanup=False) == "done"
    job.cleanup(k8s=True, gcs=False)  # the Job and its pod go; storage keeps the log copy

    def pod_gone() -> bool:
        out = subprocess.run(
            ["kubectl", "get", "pods", "-l", f"job-id={job.job_id}", "-o", "name"],
            capture_output=True,
            text=True,
            env={**os.environ},
            check=False,
        )
        return out.returncode == 0 and not out.stdout.strip()

    wait_for(pod_gone, timeout=60)
    assert "line 4" in (job.logs() or "")
    assert job.tail(1).strip() == "line 4"
    assert "line 0" in "".join(job.iter_logs())


def test_cancel_ends_a_running_job(gke: GKETarget) -> None:
    job = kinetic.run(**gke.run_args())(sleeper).run_async(120)
    wait_for(lambda: job.status() is JobStatus.RUNNING, timeout=60)
    started = time.monotonic()
    job.cancel()
    report = job.status_report()
    assert report.status is JobStatus.FAILED
    assert report.cancelled
    with pytest.raises(kinetic.JobCancelledError):
        job.result(timeout=60)
    assert time.monotonic() - started < 30
    job.cleanup()
    assert gke.object_names(f"{job.job_id}/") == []


def test_cleanup_deletes_job_and_objects(gke: GKETarget) -> None:
    job = kinetic.run(**gke.run_args())(square).run_async(3)
    assert job.result(timeout=120, cleanup=False) == 9
    assert gke.object_names(f"{job.job_id}/")
    job.cleanup()
    assert gke.object_names(f"{job.job_id}/") == []
    wait_for(lambda: job.status() is JobStatus.NOT_FOUND, timeout=60)
    assert any(
        k.startswith("default/contexts/") for k in gke.object_names("default/")
    )  # shared: kept


def test_attach_and_list_jobs_from_another_process(gke: GKETarget) -> None:
    job = kinetic.run(**gke.run_args())(square).run_async(4)
    assert job.result(timeout=120, cleanup=False) == 16
    code = f"""
import json, kinetic
h = kinetic.attach({job.job_id!r}, project={gke.project!r}, cluster={gke.cluster!r}, backend="gke")
ids = [j.job_id for j in kinetic.list_jobs(project={gke.project!r}, cluster={gke.cluster!r},
       backend="gke", namespace={gke.namespace!r})]
print(json.dumps({{"status": h.status().value, "value": h.result(timeout=60, cleanup=False),
                  "ids": ids}}))
"""
    out = run_python(code)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"status": "SUCCEEDED", "value": 16, "ids": [job.job_id]}
    job.cleanup()


def test_each_asyncio_run_closes_the_connections_it_opened(gke: GKETarget) -> None:
    # An application that runs asyncio.run per task (a script, a CLI, a test suite):
    # when each loop ends, its Kubernetes and storage clients close with it.
    job = kinetic.run(**gke.run_args())(square).run_async(5)
    assert job.result(timeout=120, cleanup=False) == 25
    code = f"""
import asyncio, gc, json, os
from kinetic import aio

def sockets():
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{{fd}}").startswith("socket:")
        except OSError:  # the listing's own descriptor, closed since
            pass
    return count

async def look():
    job = await aio.attach({job.job_id!r}, project={gke.project!r}, cluster={gke.cluster!r},
                           backend="gke")
    return [(await job.status()).value, await job.result(timeout=60, cleanup=False)]

seen = []
for _ in range(4):
    seen.append(asyncio.run(look()))
    gc.collect()
    seen.append(sockets())
print(json.dumps(seen))
"""
    out = run_python(code, "-W", "error::ResourceWarning")
    assert "Unclosed" not in out.stderr, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == [["SUCCEEDED", 25], 0] * 4
    job.cleanup()


@pytest.mark.parametrize(
    ("accelerator", "platform"), [("l4", "cuda"), ("tpu-v5litepod-4", "tpu"), ("cpu:1", "cpu")]
)
def test_gpu_tpu_and_cpu_shaped_specs_schedule(
    gke: GKETarget, accelerator: str, platform: str
) -> None:
    job = kinetic.run(**gke.run_args(accelerator=accelerator))(platform_env).run_async()
    env = job.result(timeout=120)
    assert env["JAX_PLATFORMS"] == platform
    assert env["JOB_ID"] == job.job_id
    assert env["KINETIC_OUTPUT_DIR"] == f"gs://{gke.bucket}/outputs/{job.job_id}"


def test_unknown_accelerator_is_refused(gke: GKETarget) -> None:
    with pytest.raises(kinetic.AcceleratorError, match="Valid forms"):
        kinetic.run(**gke.run_args(accelerator="gpu-z9000"))(square)
    assert gke.object_names() == []


def test_missing_namespace_is_a_config_error_and_writes_nothing_lasting(gke: GKETarget) -> None:
    fn = kinetic.run(**gke.run_args(namespace="no-such-namespace"))(square)
    with pytest.raises(kinetic.ConfigError, match="no-such-namespace"):
        fn.run_async(1)
    assert [k for k in gke.object_names() if k.startswith("job-")] == []


def test_unschedulable_accelerator_fails_after_the_grace(gke: GKETarget) -> None:
    job = kinetic.run(**gke.run_args(accelerator="gpu-h100"))(square).run_async(1)
    report = wait_for(
        lambda: (r := job.status_report()).reason and r, timeout=60
    )  # surfaced while pending
    assert report.status is JobStatus.PENDING
    assert "unschedulable" in report.reason
    assert "unschedulable" in (job.logs() or "")
    started = time.monotonic()
    with pytest.raises(kinetic.JobFailedError, match="could not start within .*unschedulable"):
        job.result(timeout=60)
    assert time.monotonic() - started < 30
    assert job.status_report().phase == "start"  # recorded for every process
    job.cleanup()


def test_image_pull_failure_fails_after_the_grace(gke: GKETarget) -> None:
    registry = gke.testbed.env["KINETIC_TESTBED_REGISTRY"]
    args = gke.run_args(container_image=f"{registry}/kinetic-no-such-image:missing")
    job = kinetic.run(**args)(square).run_async(1)
    with pytest.raises(kinetic.JobFailedError, match="ErrImagePull|ImagePullBackOff"):
        job.result(timeout=90)
    job.cleanup()


def _kill_container(gke: GKETarget, job_id: str) -> None:
    socket = gke.testbed.env["DOCKER_HOST"].removeprefix("unix://")
    c = SyncHttp(unix_socket=socket)
    filters = json.dumps({"label": ["io.kubernetes.container.name=kinetic"]})
    found = [
        ctr
        for ctr in c.get("/containers/json", params={"filters": filters}).json()
        if ctr["Labels"].get("io.kubernetes.pod.name", "").startswith(f"kinetic-{job_id}-")
    ]
    assert len(found) == 1, found
    c.post(f"/containers/{found[0]['Id']}/kill", params={"signal": "KILL"}).raise_for_status()


def test_pod_killed_mid_run_fails_with_a_reason(gke: GKETarget) -> None:
    job = kinetic.run(**gke.run_args())(sleeper).run_async(120)
    wait_for(lambda: job.status() is JobStatus.RUNNING, timeout=60)
    time.sleep(1)
    _kill_container(gke, job.job_id)
    with pytest.raises(kinetic.JobFailedError, match="signal 9"):
        job.result(timeout=60)
    job.cleanup()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_status_keeps_flowing_across_an_apiserver_restart(gke: GKETarget) -> None:
    job = kinetic.run(**gke.run_args())(sleeper).run_async(12)
    wait_for(lambda: job.status() is JobStatus.RUNNING, timeout=60)
    seen: list[JobStatus] = []
    outcome: dict[str, object] = {}

    def wait() -> None:
        try:
            outcome["value"] = job.result(timeout=150, on_status_change=seen.append)
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome["error"] = exc

    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_for(lambda: seen, timeout=30)  # the watch is established
    pid = gke.testbed.pid_of("kube-apiserver")
    os.kill(pid, signal.SIGTERM)
    try:
        wait_for(lambda: not _alive(pid), timeout=10)
    except AssertionError:  # an apiserver with open watches can take > 35 s on SIGTERM
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not _alive(pid), timeout=30)
    gke.testbed.up()  # brings the apiserver back (only what is down is started)
    waiter.join(timeout=150)
    assert outcome.get("value") == "slept", outcome
    assert seen[0] is JobStatus.RUNNING
    assert seen[-1] is JobStatus.SUCCEEDED


def test_result_deleted_before_collection_is_a_clear_error(gke: GKETarget) -> None:
    job = kinetic.run(**gke.run_args())(square).run_async(2)
    wait_for(lambda: job.status() is JobStatus.SUCCEEDED, timeout=120)
    gke.delete_object(f"{job.job_id}/result.pkl")
    with pytest.raises(kinetic.ResultError, match="missing"):
        job.result(timeout=60)
    job.cleanup()
