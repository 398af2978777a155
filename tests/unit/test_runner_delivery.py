"""A custom image's pods get Kinetic's runner with the job: manifests, status, path rules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kinetic._core import accel_runtime, accelerators, k8s_spec, k8s_status, lws_spec
from kinetic._core import runner_delivery as rd
from kinetic._core.gke_config import GKEOptions
from kinetic._core.status import JobStatus
from kinetic._images.delivery import base_image_for
from runner import DEPS_ENV

RUNNER_IMAGE = "reg/kinetic-runner:k123"


def template(runner_image: str = RUNNER_IMAGE, accel: str = "cpu") -> k8s_spec.JobTemplate:
    return k8s_spec.JobTemplate(
        namespace="ns",
        image="reg/original-style:1",
        bucket="p-kn-c-jobs",
        accelerator=accelerators.parse_accelerator(accel),
        output_dir="gs://p-kn-c-jobs/outputs/job-1",
        env={"PYTHONPATH": "/app"},
        pod=k8s_spec.PodOptions(image_pull_policy="IfNotPresent"),
        runner_image=runner_image,
    )


def pod_spec(m: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = m["spec"]["template"]["spec"]
    return spec


def test_a_custom_images_job_copies_the_runner_in_and_runs_it_with_python3() -> None:
    spec = pod_spec(k8s_spec.job_manifest(template(), "job-1"))
    (init,) = spec["initContainers"]
    assert init["image"] == RUNNER_IMAGE
    assert init["imagePullPolicy"] == "IfNotPresent"
    assert init["command"][:2] == ["sh", "-c"]
    assert {"name": rd.VOLUME, "mountPath": rd.MOUNT} in init["volumeMounts"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert {"name": rd.VOLUME, "emptyDir": {}} in spec["volumes"]
    job = spec["containers"][0]
    assert job["command"][:3] == ["python3", "-m", "runner"]
    assert {"name": rd.VOLUME, "mountPath": rd.MOUNT, "readOnly": True} in job["volumeMounts"]
    # `-m` puts the working directory first: Kinetic's runner and cloudpickle win...
    assert job["workingDir"] == rd.SOURCES
    env = {e["name"]: e["value"] for e in job["env"] if "value" in e}
    # ...and the image's own path is left alone, Kinetic's dependencies after it.
    assert env["PYTHONPATH"] == "/app"
    assert env[DEPS_ENV] == rd.DEPS
    assert [e["name"] for e in job["env"]] == sorted(e["name"] for e in job["env"])


def test_a_kinetic_image_job_is_unchanged() -> None:
    spec = pod_spec(k8s_spec.job_manifest(template(runner_image=""), "job-1"))
    assert "initContainers" not in spec
    assert "volumes" not in spec
    job = spec["containers"][0]
    assert job["command"][0] == "python"
    assert "workingDir" not in job
    assert DEPS_ENV not in {e["name"] for e in job["env"]}


def test_batch_members_pool_workers_and_hosts_run_the_delivered_runner() -> None:
    member = k8s_spec.member_job_manifest(template(), group_id="g-1", index=3, attempt=0)
    pool = k8s_spec.pool_job_manifest(template(), group_id="g-1", workers=2)
    for m in (member, pool):
        spec = pod_spec(m)
        assert spec["initContainers"][0]["image"] == RUNNER_IMAGE
        assert spec["containers"][0]["command"][0] == "python3"
    assert pod_spec(pool)["containers"][0]["command"][2] == "runner.pool"
    slice_ = template(accel="v5litepod-16")
    job = k8s_spec.job_manifest(slice_, "job-1")
    lws = lws_spec.lws_manifest(job, accelerator=slice_.accelerator, version="v1")
    for role in ("leaderTemplate", "workerTemplate"):
        host = lws["spec"]["leaderWorkerTemplate"][role]["spec"]
        assert host["initContainers"][0]["image"] == RUNNER_IMAGE
        assert host["containers"][0]["command"][0] == "python3"


@pytest.mark.parametrize(
    ("image", "delivered"),
    [
        ("us-docker.pkg.dev/p/r/original-style:1", True),
        ("python:3.12-slim", True),
        ("my-kinetic-runner-fork:1", True),
        ("127.0.0.1:5000/kinetic-runner:k1", False),
        ("reg/p/kinetic/kinetic-runtime:k2", False),
        ("reg/base-gpu:0.3.0-py3.12", False),
        ("reg/kinetic-runner@sha256:" + "0" * 64, False),
    ],
)
def test_only_images_kinetic_did_not_build_get_the_runner(image: str, delivered: bool) -> None:
    assert rd.needs_delivery(image) is delivered


def test_the_runner_image_follows_the_clients_python() -> None:
    assert base_image_for(GKEOptions(base_image="python:3.12-slim"), "3.12") == "python:3.12-slim"
    assert base_image_for(GKEOptions(base_image="python:3.11-slim"), "3.13") == "python:3.13-slim"
    trixie = GKEOptions(base_image="local/debian-py:trixie")
    assert base_image_for(trixie, "3.13") == "local/debian-py:trixie"
    assert accel_runtime.image_python("debian:bookworm-slim") == "3.11"


def pod(state: dict[str, Any], init: dict[str, Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": "Failed" if "terminated" in state else "Pending",
        "containerStatuses": [{"image": "reg/no-python:1", "state": state}],
    }
    if init is not None:
        status["initContainerStatuses"] = [{"image": RUNNER_IMAGE, "state": init}]
    return {"metadata": {"name": "p", "creationTimestamp": "t"}, "status": status}


def test_an_image_without_python3_fails_in_phase_fetch_saying_what_it_needs() -> None:
    no_exec = {
        "reason": "ContainerCannotRun",
        "exitCode": 127,
        "message": 'exec: "python3": executable file not found in $PATH: unknown',
    }
    report = k8s_status.pod_report(pod({"terminated": no_exec}))
    assert (report.status, report.phase) == (JobStatus.FAILED, "fetch")
    assert report.reason is not None
    assert "reg/no-python:1" in report.reason
    assert "`python3`" in report.reason
    assert "executable file not found" in report.reason
    started = {"reason": "StartError", "exitCode": 128, "message": "no such file"}
    assert k8s_status.pod_report(pod({"terminated": started})).phase == "fetch"
    # An ordinary failure of the job's own process is not the image's fault.
    plain = k8s_status.pod_report(pod({"terminated": {"reason": "Error", "exitCode": 1}}))
    assert (plain.status, plain.phase) == (JobStatus.FAILED, None)


def test_a_failed_delivery_fails_in_phase_fetch_and_an_unpullable_one_cannot_start() -> None:
    failed = {"terminated": {"reason": "Error", "exitCode": 1, "message": "cp: no space"}}
    report = k8s_status.pod_report(pod({"waiting": {"reason": "PodInitializing"}}, failed))
    assert (report.status, report.phase) == (JobStatus.FAILED, "fetch")
    assert report.reason is not None
    assert RUNNER_IMAGE in report.reason
    assert "cp: no space" in report.reason
    pulling = {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}
    stuck = k8s_status.pod_report(pod({"waiting": {"reason": "PodInitializing"}}, pulling))
    assert stuck.status is JobStatus.PENDING
    assert k8s_status.cannot_start(stuck)
    assert stuck.reason is not None
    assert RUNNER_IMAGE in stuck.reason
    done = {"terminated": {"reason": "Completed", "exitCode": 0}}
    running = k8s_status.pod_report(pod({"running": {}}, done))
    assert running.status is JobStatus.RUNNING


def test_the_runner_appends_the_delivered_dependencies_after_the_images_own(
    tmp_path: Path,
) -> None:
    deps = tmp_path / "deps"
    (deps / "only_delivered").mkdir(parents=True)
    (deps / "only_delivered" / "__init__.py").write_text("WHERE = 'delivered'\n")
    root = Path(__file__).parents[2]
    code = "import runner, sys, only_delivered; print(sys.path.index(sys.argv[1]), len(sys.path))"
    out = subprocess.run(
        [sys.executable, "-c", code, str(deps)],
        env={**os.environ, DEPS_ENV: str(deps), "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert int(out[0]) == int(out[1]) - 1  # last: the image's packages come first
