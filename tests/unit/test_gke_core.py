"""Pure rules of the GKE backend: Job specs, status mapping, image spec, knobs."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kinetic._core import accelerators, image_spec, k8s_spec, k8s_status, lws_spec
from kinetic._core.config import capture_env
from kinetic._core.gke_config import options_from_env
from kinetic._core.status import JobStatus
from kinetic._exceptions import ConfigError


def manifest(accel: str = "cpu", **pod: Any) -> dict[str, Any]:
    template = k8s_spec.JobTemplate(
        namespace="ns",
        image="reg/img:t",
        bucket="p-kn-c-jobs",
        accelerator=accelerators.parse_accelerator(accel),
        output_dir="gs://p-kn-c-jobs/outputs/job-1234abcd",
        env={"MY_VAR": "1", "JOB_ID": "overridden"},
        pod=k8s_spec.PodOptions(**pod),
    )
    return k8s_spec.job_manifest(template, "job-1234abcd")


def cpu_template(**kw: Any) -> k8s_spec.JobTemplate:
    return k8s_spec.JobTemplate(
        namespace="default",
        image="img",
        bucket="b",
        accelerator=accelerators.parse_accelerator("cpu"),
        output_dir="gs://b/out",
        **kw,
    )


def container(m: dict[str, Any]) -> dict[str, Any]:
    return m["spec"]["template"]["spec"]["containers"][0]


def env_of(m: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(m)["env"] if "value" in e}


def test_names_labels_and_no_kubernetes_retries() -> None:
    m = manifest()
    assert m["metadata"]["name"] == "kinetic-job-1234abcd"
    assert m["metadata"]["labels"] == {"app": "kinetic", "job-id": "job-1234abcd"}
    assert m["spec"]["template"]["metadata"]["labels"] == m["metadata"]["labels"]
    assert m["spec"]["backoffLimit"] == 0
    assert m["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert container(m)["command"] == [
        "python",
        "-m",
        "runner",
        "--storage",
        "gs://p-kn-c-jobs",
        "--job-id",
        "job-1234abcd",
        "--upload-logs",
    ]


def test_lost_pods_are_replaced_up_to_the_retries_count_and_failures_never() -> None:
    plain = manifest()
    policy = plain["spec"]["podFailurePolicy"]["rules"]
    # A disrupted pod (preempted, evicted) is counted and replaced while backoffLimit allows
    assert policy[0] == {
        "action": "Count",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    # ... and a runner that exited non-zero (it recorded the failure) fails the Job at once.
    assert policy[1]["action"] == "FailJob"
    assert policy[1]["onExitCodes"] == {
        "containerName": "kinetic",
        "operator": "NotIn",
        "values": [0],
    }
    single = k8s_spec.job_manifest(cpu_template(retries=3), "job-1")
    assert single["spec"]["backoffLimit"] == 3
    # The runner learns its pod's name, to tell a replacement that the pod before it was lost.
    assert {
        "name": "KINETIC_POD_NAME",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
    } in container(plain)["env"]


def test_env_has_kinetic_variables_over_captured_ones() -> None:
    env = env_of(manifest("l4"))
    assert env["JOB_ID"] == "job-1234abcd"
    assert env["MY_VAR"] == "1"
    assert env["KINETIC_OUTPUT_DIR"] == "gs://p-kn-c-jobs/outputs/job-1234abcd"
    assert env["KINETIC_STORAGE"] == "gs://p-kn-c-jobs"
    assert env["JAX_PLATFORMS"] == "cuda"


@pytest.mark.parametrize("accel", ["cpu", "l4", "tpu-v5litepod-4", "tpu-v6e-8"])
def test_a_captured_keras_backend_overrides_the_images_default(accel: str) -> None:
    # The image sets KERAS_BACKEND=jax in its ENV; a container's env overrides its image's,
    # so the user's captured value is what the job's process sees (single job, pool,
    # pathways host alike). The runner applies the spec's copy too.
    assert "KERAS_BACKEND=jax" in image_spec.env_dockerfile("python:3.11-slim")
    captured = capture_env(["KERAS_BACKEND"], {"KERAS_BACKEND": "torch", "OTHER": "x"})
    config = accelerators.parse_accelerator(accel)
    template = k8s_spec.JobTemplate(
        namespace="ns",
        image="reg/img:t",
        bucket="b",
        accelerator=config,
        output_dir="gs://b/outputs/job-1234abcd",
        env=captured,
    )
    single = k8s_spec.job_manifest(template, "job-1234abcd")
    pool = k8s_spec.pool_job_manifest(template, group_id="grp-1234abcd", workers=2)
    containers = [container(single), container(pool)]
    if lws_spec.hosts_of(config) > 1:
        lws = lws_spec.lws_manifest(single, accelerator=config, version="v1")
        for role in ("leaderTemplate", "workerTemplate"):
            containers.append(lws["spec"]["leaderWorkerTemplate"][role]["spec"]["containers"][0])
    for one in containers:
        assert {e["name"]: e.get("value") for e in one["env"]}["KERAS_BACKEND"] == "torch"
        assert "OTHER" not in {e["name"] for e in one["env"]}
    # Without it, the container says nothing and the image's jax stands.
    bare = k8s_spec.job_manifest(dataclasses.replace(template, env=None), "job-1234abcd")
    assert "KERAS_BACKEND" not in env_of(bare)


@pytest.mark.parametrize(
    ("accel", "selector", "resource"),
    [
        ("l4", {"cloud.google.com/gke-accelerator": "nvidia-l4"}, {"nvidia.com/gpu": "1"}),
        (
            "a100-80gbx4",
            {"cloud.google.com/gke-accelerator": "nvidia-a100-80gb"},
            {"nvidia.com/gpu": "4"},
        ),
        (
            "v5e-2x2",
            {
                "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
                "cloud.google.com/gke-tpu-topology": "2x2",
            },
            {"google.com/tpu": "4"},
        ),
        (
            "tpu-v6e-8:spot",
            {
                "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                "cloud.google.com/gke-tpu-topology": "2x4",
                "cloud.google.com/gke-spot": "true",
            },
            {"google.com/tpu": "4"},
        ),
    ],
)
def test_accelerator_fields(accel: str, selector: dict[str, str], resource: dict[str, str]) -> None:
    m = manifest(accel)
    pod = m["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == selector
    assert container(m)["resources"] == {"requests": resource, "limits": resource}
    assert pod["tolerations"]


def test_cpu_jobs_request_real_cpu_and_memory() -> None:
    assert container(manifest("cpu"))["resources"] == {
        "requests": {"cpu": "250m", "memory": "512Mi"}
    }
    four = {"cpu": "4", "memory": "8Gi"}
    assert container(manifest("cpu:4"))["resources"] == {"requests": four, "limits": four}
    assert container(manifest("cpu:2:3gi"))["resources"]["requests"] == {
        "cpu": "2",
        "memory": "3Gi",
    }
    assert "nodeSelector" not in manifest("cpu")["spec"]["template"]["spec"]


def test_pod_knobs() -> None:
    m = manifest(service_account="sa", host_network=True, image_pull_policy="Always")
    pod = m["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "sa"
    assert pod["hostNetwork"] is True
    assert container(m)["imagePullPolicy"] == "Always"
    plain = manifest()["spec"]["template"]["spec"]
    assert "serviceAccountName" not in plain
    assert "hostNetwork" not in plain
    with pytest.raises(ConfigError, match="pull policy"):
        k8s_spec.PodOptions(image_pull_policy="Sometimes")


def test_options_from_env() -> None:
    opts = options_from_env(
        {
            "KINETIC_GKE_SERVICE_ACCOUNT": "sa",
            "KINETIC_GKE_HOST_NETWORK": "true",
            "KINETIC_GKE_START_GRACE": "7",
            "STORAGE_EMULATOR_HOST": "http://127.0.0.1:1",
        }
    )
    assert opts.pod.service_account == "sa"
    assert opts.pod.host_network
    assert opts.start_grace == 7.0
    assert opts.pod.extra_env == {"STORAGE_EMULATOR_HOST": "http://127.0.0.1:1"}
    with pytest.raises(ConfigError, match="KINETIC_GKE_START_GRACE"):
        options_from_env({"KINETIC_GKE_START_GRACE": "soon"})
    with pytest.raises(ConfigError, match="KINETIC_GKE_HOST_NETWORK"):
        options_from_env({"KINETIC_GKE_HOST_NETWORK": "maybe"})


# -- status mapping ------------------------------------------------------------------


def pod(phase: str, state: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    st: dict[str, Any] = {"phase": phase, **status}
    if state is not None:
        st["containerStatuses"] = [{"state": state, "image": "reg/img:t"}]
    return {
        "metadata": {
            "name": "p",
            "labels": {"job-id": "j"},
            "creationTimestamp": "2024-01-01T00:00:00Z",
        },
        "status": st,
    }


JOB = {"metadata": {"name": "kinetic-j"}, "status": {}}


def derive(**kw: Any) -> Any:
    args: dict[str, Any] = {"final": None, "cancelled": False, "job": JOB, "pods": []}
    args.update(kw)
    return k8s_status.status_from_k8s(**args)


SINGLE_JOB = {
    "metadata": {"name": "kinetic-j", "annotations": {k8s_spec.REPLACES_LOST_PODS: "true"}},
    "status": {},
}
"""A single job's Job as the API server keeps it: Kubernetes replaces its lost pods."""


def given_up(reason: str) -> dict[str, Any]:
    failed = {"type": "Failed", "status": "True", "reason": reason, "message": reason}
    return {**SINGLE_JOB, "status": {"conditions": [failed]}}


def test_a_lost_pod_of_a_single_job_is_preempted_until_its_job_gives_up() -> None:
    # A pod deleted before it finished (evicted through the API, its node gone): Kubernetes
    # starts a replacement, so the job is pending -- not failed, as it once said.
    waiting = derive(job=SINGLE_JOB, lost_pod="p")
    assert (waiting.status, waiting.preempted, waiting.reason) == (JobStatus.PENDING, True, None)
    assert not k8s_status.cannot_start(waiting)  # a waiter does not count it as stuck
    # ... then the replacement pod's state, still marked as preempted.
    running = derive(job=SINGLE_JOB, lost_pod="p", pods=[pod("Running", {"running": {}})])
    assert (running.status, running.preempted) == (JobStatus.RUNNING, True)
    # The Job gave up (no retry left: backoffLimit is the retries count): FAILED, preempted.
    out = derive(job=given_up("BackoffLimitExceeded"), lost_pod="p")
    assert (out.status, out.phase, out.preempted) == (JobStatus.FAILED, "preempted", True)
    assert "no retry was left" in str(out.reason)
    # A person deleted the pod of a job whose runner then exited non-zero: a plain failure.
    deleted = derive(job=given_up(k8s_status.POLICY_FAILURE), lost_pod="p")
    assert (deleted.status, deleted.preempted) == (JobStatus.FAILED, False)
    assert "deleted" in str(deleted.reason)


def test_a_disrupted_pod_is_preempted_by_its_condition_or_its_reason() -> None:
    spot = pod(
        "Failed",
        {"terminated": {"reason": "Error", "exitCode": 143}},
        conditions=[
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "TerminationByKubelet",
                "message": "Pod was terminated in response to imminent node shutdown.",
            }
        ],
    )
    evicted = pod("Failed", reason="Evicted", message="The node was low on resource: memory.")
    for lost in (spot, evicted):
        again = derive(job=SINGLE_JOB, pods=[lost])
        assert (again.status, again.preempted) == (JobStatus.PENDING, True)
        final = derive(job=given_up("BackoffLimitExceeded"), pods=[lost])
        assert (final.status, final.phase, final.preempted) == (JobStatus.FAILED, "preempted", True)
    assert "TerminationByKubelet" in str(derive(job=given_up("X"), pods=[spot]).reason)
    # A plain failure of the container is no disruption.
    crashed = pod("Failed", {"terminated": {"reason": "Error", "exitCode": 1}})
    assert derive(job=SINGLE_JOB, pods=[crashed]).preempted is False


def test_a_batch_jobs_lost_pod_is_left_to_its_driver() -> None:
    # Per-input Jobs and the pool's Job carry no annotation: a lost pod fails as it says.
    assert derive(lost_pod="p").status is JobStatus.FAILED
    evicted = derive(pods=[pod("Failed", reason="Evicted", message="low memory")])
    assert (evicted.status, evicted.preempted) == (JobStatus.FAILED, False)
    group = "grp-0123456789ab"
    template = cpu_template(retries=2)
    for batch_job in (
        k8s_spec.member_job_manifest(template, group_id=group, index=0, attempt=0),
        k8s_spec.pool_job_manifest(template, group_id=group, workers=4),
    ):
        assert k8s_spec.REPLACES_LOST_PODS not in batch_job["metadata"]["annotations"]
        assert "podFailurePolicy" not in batch_job["spec"]
    single = k8s_spec.job_manifest(template, "job-1")
    assert single["metadata"]["annotations"][k8s_spec.REPLACES_LOST_PODS] == "true"


def test_a_runner_record_of_preemption_is_preempted() -> None:
    record = {"state": "failed", "phase": "preempted", "error": "Preempted: lost"}
    out = derive(final=record)
    assert (out.status, out.preempted) == (JobStatus.FAILED, True)
    assert derive(final={**record, "phase": "execute"}).preempted is False


def test_final_record_wins() -> None:
    ok = derive(final={"state": "succeeded"}, pods=[pod("Failed")])
    assert ok.status is JobStatus.SUCCEEDED
    bad = derive(final={"state": "failed", "error": "KeyError: x", "phase": "execute"})
    assert (bad.status, bad.reason, bad.phase) == (JobStatus.FAILED, "KeyError: x", "execute")
    assert derive(cancelled=True).cancelled


def test_pod_states() -> None:
    assert derive(pods=[pod("Running", {"running": {}})]).status is JobStatus.RUNNING
    assert derive(pods=[pod("Succeeded")]).status is JobStatus.SUCCEEDED
    oom = derive(pods=[pod("Failed", {"terminated": {"reason": "OOMKilled", "exitCode": 137}})])
    assert oom.status is JobStatus.FAILED
    assert "OOMKilled" in str(oom.reason)
    killed = derive(pods=[pod("Failed", {"terminated": {"reason": "Error", "exitCode": 137}})])
    assert "signal 9" in str(killed.reason)
    exited = derive(pods=[pod("Failed", {"terminated": {"reason": "Error", "exitCode": 2}})])
    assert "status 2" in str(exited.reason)
    evicted = derive(pods=[pod("Failed", reason="Evicted", message="low memory")])
    assert evicted.reason == "Evicted: low memory"


def test_cannot_start_reasons() -> None:
    pull = derive(
        pods=[pod("Pending", {"waiting": {"reason": "ImagePullBackOff", "message": "nope"}})]
    )
    assert k8s_status.cannot_start(pull)
    assert "ImagePullBackOff" in str(pull.reason)
    unsched = derive(
        pods=[
            pod(
                "Pending",
                conditions=[
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/1 nodes are available",
                    }
                ],
            )
        ]
    )
    assert k8s_status.cannot_start(unsched)
    assert "unschedulable" in str(unsched.reason)
    creating = derive(pods=[pod("Pending", {"waiting": {"reason": "ContainerCreating"}})])
    assert creating.status is JobStatus.PENDING
    assert not k8s_status.cannot_start(creating)
    sa = derive(
        events=[
            {
                "reason": "FailedCreate",
                "message": 'serviceaccount "x" not found',
                "lastTimestamp": "2024-01-01T00:00:01Z",
            }
        ]
    )
    assert k8s_status.cannot_start(sa)
    assert "serviceaccount" in str(sa.reason)


def test_gone_objects() -> None:
    lost = derive(pods=[], lost_pod="p")
    assert lost.status is JobStatus.FAILED
    assert "deleted" in str(lost.reason)
    assert derive(job=None).status is JobStatus.FAILED
    assert derive(job=None, recorded=False).status is JobStatus.NOT_FOUND
    failed_job = {
        "status": {
            "conditions": [{"type": "Failed", "status": "True", "message": "BackoffLimitExceeded"}]
        }
    }
    assert derive(job=failed_job).status is JobStatus.FAILED


# -- image spec ----------------------------------------------------------------------


def test_image_tags_are_content_addressed() -> None:
    a = image_spec.env_tag("base", ["x==1"])
    assert a == image_spec.env_tag("base", ["x==1"])
    assert a != image_spec.env_tag("base2", ["x==1"])
    assert a != image_spec.env_tag("base", ["x==2"])
    k = image_spec.runner_tag("r/env:" + a, {"kinetic/a.py": "d1"})
    assert k == image_spec.runner_tag("r/env:" + a, {"kinetic/a.py": "d1"})
    assert k != image_spec.runner_tag("r/env:" + a, {"kinetic/a.py": "d2"})


def test_dockerfile_installs_offline_and_context_is_deterministic() -> None:
    text = image_spec.env_dockerfile("local/debian-py:bookworm")
    assert text.startswith("# Kinetic environment image")
    assert "FROM local/debian-py:bookworm" in text
    assert "--no-index" in text
    files = image_spec.env_context_files("b", ["x==1"], {"x.whl": b"w"})
    assert set(files) == {"Dockerfile", "requirements.txt", "wheels/x.whl"}
    assert image_spec.build_context(files) == image_spec.build_context(
        dict(reversed(files.items()))
    )
    source = image_spec.runner_context_files("r/env:e1", {"runner/a.py": b"1"})
    assert set(source) == {"Dockerfile", "src/runner/a.py"}


@pytest.mark.parametrize(
    ("uri", "parts"),
    [
        ("127.0.0.1:5000/kinetic-runner:k1", ("127.0.0.1:5000", "kinetic-runner", "k1")),
        ("reg.example/p/r/img", ("reg.example", "p/r/img", "latest")),
        ("python:3.11", ("docker.io", "library/python", "3.11")),
    ],
)
def test_parse_image_uri(uri: str, parts: tuple[str, str, str]) -> None:
    assert image_spec.parse_image_uri(uri) == parts


def test_gcs_fuse_volumes_mount_each_bucket_read_only() -> None:
    base = manifest()
    fused = k8s_spec.with_gcs_fuse(base, {"data-b", "data-a"})
    template = fused["spec"]["template"]
    assert template["metadata"]["annotations"]["gke-gcsfuse/volumes"] == "true"
    volumes = template["spec"]["volumes"]
    assert [v["csi"]["volumeAttributes"]["bucketName"] for v in volumes] == ["data-a", "data-b"]
    assert all(v["csi"]["driver"] == "gcsfuse.csi.storage.gke.io" for v in volumes)
    assert all(v["csi"]["readOnly"] for v in volumes)
    mounts = container(fused)["volumeMounts"]
    assert [m["mountPath"] for m in mounts] == ["/kinetic-fuse/data-a", "/kinetic-fuse/data-b"]
    assert all(m["readOnly"] for m in mounts)
    assert "volumes" not in base["spec"]["template"]["spec"]  # the input is left as it was
    assert k8s_spec.with_gcs_fuse(base, []) == base


def test_member_job_manifest_names_labels_and_command() -> None:
    from runner import protocol

    cfg = accelerators.parse_accelerator("cpu")
    group = "grp-0123456789ab"
    template = k8s_spec.JobTemplate(
        namespace="ns", image="img:1", bucket="b", accelerator=cfg, output_dir="gs://b/outputs"
    )
    first = k8s_spec.member_job_manifest(template, group_id=group, index=5, attempt=0)
    retry = k8s_spec.member_job_manifest(template, group_id=group, index=5, attempt=2)
    member = protocol.member_job_id(group, 5)
    assert first["metadata"]["name"] == f"kinetic-{member}"
    assert retry["metadata"]["name"] == f"kinetic-{member}-a2"
    labels = retry["spec"]["template"]["metadata"]["labels"]
    assert labels == retry["metadata"]["labels"]
    assert labels["group-id"] == group
    assert (labels["group-index"], labels["attempt"], labels["job-id"]) == (
        "5",
        "2",
        f"{member}-a2",
    )
    container = retry["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][-7:] == [
        "--group", group, "--index", "5", "--attempt", "2", "--upload-logs",
    ]  # fmt: skip
    env = env_of(retry)
    assert env["JOB_ID"] == member
    assert env["KINETIC_OUTPUT_DIR"] == f"gs://b/outputs/{member}"
    assert retry["spec"]["backoffLimit"] == 0
    assert k8s_spec.group_selector(group) == f"app=kinetic,group-id={group}"


def test_outcome_objects_round_trip_and_reject_garbage() -> None:
    from runner import protocol

    header = {"state": "failed", "attempt": 1, "error": "E: x\ny", "phase": "execute"}
    payload = b"\x80\x05binary\nwith newlines"
    data = protocol.encode_outcome(header, payload)
    assert protocol.decode_outcome(data) == (header, payload)
    assert protocol.group_outcome_key("grp-1", 7) == "_groups/grp-1/results/0000007.res"
    with pytest.raises(ValueError, match="not a batch outcome"):
        protocol.decode_outcome(b'{"no": "state"}\npayload')


@pytest.mark.parametrize("name", ["cpu", "l4", "tpu-v5e-1"])
def test_a_jobs_pod_has_no_token_and_no_privileges(name: str) -> None:
    """One job's pod must not act on the others (no Kubernetes credentials) nor gain
    privileges in its container; TPU containers keep the runtime's capabilities."""
    cfg = accelerators.parse_accelerator(name)
    template = k8s_spec.JobTemplate(
        namespace="ns", image="img:1", bucket="b", accelerator=cfg, output_dir="gs://b/o"
    )
    pod = k8s_spec.job_manifest(template, "job-0123abcd")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    context = pod["containers"][0]["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context.get("capabilities") == (None if cfg.kind == "tpu" else {"drop": ["ALL"]})
    asked = dataclasses.replace(
        template, pod=options_from_env({"KINETIC_GKE_JOB_API_ACCESS": "1"}).pod
    )
    granted = k8s_spec.job_manifest(asked, "job-0123abcd")["spec"]["template"]["spec"]
    assert granted["automountServiceAccountToken"] is True
    assert granted["containers"][0]["securityContext"] == context
    pool = k8s_spec.pool_job_manifest(template, group_id="grp-0123456789ab", workers=3)
    assert pool["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
