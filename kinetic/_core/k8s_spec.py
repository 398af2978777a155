"""Kubernetes ``batch/v1`` Job manifests for GKE jobs. Pure: dicts in, dicts out.

A job is one Job with one pod that runs ``python -m runner --storage gs://BUCKET
--job-id ID --upload-logs``. Names and labels follow the original Kinetic
(``kinetic-{job_id}``, ``app=kinetic``, ``job-id``) so that tools written for it
keep finding the jobs. Kubernetes never re-runs a job that failed (``restartPolicy:
Never``, and a ``podFailurePolicy`` that fails the Job when its container exits non-zero):
a failed run is recorded by the runner, which retries in its own process (``retries=``).
Kubernetes replaces only a pod that was lost (preempted, evicted: a ``DisruptionTarget``
condition), up to ``backoffLimit`` (the ``retries`` count) times; the replacement's runner
counts the lost attempt (:mod:`runner.preemption`).

Resources, node selector and tolerations come from the accelerator catalog
(:mod:`kinetic._core.accelerators`). Unlike the original, CPU jobs request real
CPU and memory: ``cpu:N`` gets N CPUs, plain ``cpu`` a small default request.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kinetic._core import accelerators, runner_delivery, secret_spec, store_plugins
from kinetic._core.accelerators import AcceleratorConfig
from kinetic._exceptions import ConfigError
from runner.protocol import FUSE_ROOT, POD_ENV, member_attempt_id, member_job_id

APP_LABEL = "app"
APP_VALUE = "kinetic"
JOB_ID_LABEL = "job-id"
SELECTOR = f"{APP_LABEL}={APP_VALUE}"
"""The label selector every Kinetic Job and pod carries."""

CONTAINER_NAME = "kinetic"
DEFAULT_CPU_REQUEST = "250m"
"""CPU requested by a plain ``cpu`` job (no count given)."""
DEFAULT_MEMORY_REQUEST = "512Mi"
"""Memory requested by a CPU job that names no amount."""
MEMORY_PER_CPU_GI = 2
"""Memory requested per CPU for ``cpu:N`` (no ``:Mgi`` given)."""
PULL_POLICIES = ("Always", "IfNotPresent", "Never")


def job_name(job_id: str) -> str:
    """The Kubernetes name of a job's Job: ``kinetic-{job_id}``."""
    return f"kinetic-{job_id}"


def job_selector(job_id: str) -> str:
    """The label selector of one job's Job and pods."""
    return f"{SELECTOR},{JOB_ID_LABEL}={job_id}"


@dataclass(frozen=True)
class PodOptions:
    """Cluster-level knobs of the pod, from settings (not from the job).

    :ivar service_account: ``serviceAccountName``; ``None`` leaves the namespace default.
    :ivar host_network: run the pod in the node's network namespace (clusters without a
        CNI, like the test cluster).
    :ivar image_pull_policy: ``Always``, ``IfNotPresent`` or ``Never``; ``None`` lets
        Kubernetes choose (``Always`` for ``:latest``, else ``IfNotPresent``).
    :ivar extra_env: variables added to every job's container.
    :ivar api_access: mount the service account's token, so that the job may use the
        Kubernetes API with the account's rights (a job that submits jobs). Off by
        default: a job's pod then cannot act on other jobs.
    """

    service_account: str | None = None
    host_network: bool = False
    image_pull_policy: str | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    api_access: bool = False

    def __post_init__(self) -> None:
        if self.image_pull_policy is not None and self.image_pull_policy not in PULL_POLICIES:
            raise ConfigError(
                f"invalid image pull policy {self.image_pull_policy!r}; "
                f"valid: {', '.join(PULL_POLICIES)}"
            )


def cpu_resources(cfg: accelerators.CpuConfig) -> dict[str, str]:
    """Requests of a CPU job: what ``cpu:N[:Mgi]`` names, or small defaults."""
    if cfg.cpus is None:
        return {"cpu": DEFAULT_CPU_REQUEST, "memory": DEFAULT_MEMORY_REQUEST}
    memory = cfg.memory_gi if cfg.memory_gi is not None else cfg.cpus * MEMORY_PER_CPU_GI
    return {"cpu": str(cfg.cpus), "memory": f"{memory}Gi"}


def container_resources(cfg: AcceleratorConfig) -> dict[str, dict[str, str]]:
    """``resources`` of the job's container.

    GPUs and TPUs: the catalog's extended resources (requests == limits, as Kubernetes
    requires). CPU: requests always; limits equal to requests only when the user named
    an amount (``cpu:N``), so a plain ``cpu`` job may burst.
    """
    if cfg.kind != "cpu":
        return {
            "requests": accelerators.resource_requests(cfg),
            "limits": accelerators.resource_limits(cfg),
        }
    requests = cpu_resources(cfg)
    if cfg.cpus is None:
        return {"requests": requests}
    return {"requests": requests, "limits": dict(requests)}


def container_security(cfg: AcceleratorConfig) -> dict[str, Any]:
    """The job container's ``securityContext``: no privilege escalation, and no Linux
    capabilities (the runner needs none: it writes only what the image's user owns).

    The process runs as the image's user (Kinetic's images: root inside the container,
    without capabilities). TPU containers keep the runtime's default capabilities:
    libtpu locks memory and opens the TPU devices the device plugin adds, which GKE's
    TPU images expect of a default container.
    """
    context: dict[str, Any] = {"allowPrivilegeEscalation": False}
    if cfg.kind != "tpu":
        context["capabilities"] = {"drop": ["ALL"]}
    return context


def runner_command(bucket: str, job_id: str, *, python: str = "python") -> list[str]:
    """The container command: the runner, reading and writing ``gs://bucket``."""
    return [
        python,
        "-m",
        "runner",
        "--storage",
        f"gs://{bucket}",
        "--job-id",
        job_id,
        "--upload-logs",
    ]


@dataclass(frozen=True)
class JobTemplate:
    """What every Job of one submission shares (a single job's, a batch's per-input
    Jobs, a pool's one Job): where it runs and what its pods run with.

    :ivar output_dir: the job's output directory (a batch's base: each input's is
        ``{output_dir}/{member job id}``).
    :ivar env: captured variables for the container (the runner also applies the
        spec's copy); Kinetic's own variables win over them.
    :ivar runner_image: the image Kinetic's runner is delivered from into ``image`` (a
        custom image, :mod:`kinetic._core.runner_delivery`); empty when ``image``
        carries Kinetic.
    :ivar secrets: the Kubernetes Secrets the pods read (:mod:`kinetic._core.secret_spec`).
    :ivar timeout: a single job's run-time limit in seconds (:func:`active_deadline`).
    :ivar retries: a single job's ``retries`` count: how many lost pods Kubernetes
        replaces (:func:`pod_failure_policy`).
    """

    namespace: str
    image: str
    bucket: str
    accelerator: AcceleratorConfig
    output_dir: str
    env: Mapping[str, str] | None = None
    pod: PodOptions | None = None
    func_name: str | None = None
    runner_image: str = ""
    secrets: tuple[secret_spec.Secret, ...] = ()
    timeout: float | None = None
    retries: int = 0

    @property
    def python(self) -> str:
        """The interpreter of the pods' command: a custom image's ``python3``, or the
        venv's ``python`` of Kinetic's images."""
        return runner_delivery.PYTHON if self.runner_image else "python"


DEADLINE_GRACE_S = 600
"""Seconds a Job with a run-time limit may run past it before Kubernetes ends it
(:func:`active_deadline`): its pod's start (scheduling, a node's scale-up, the image
pull) and the runner's steps before the function count towards the Job's deadline,
not towards the limit, which the runner enforces itself (:mod:`runner.time_limit`)."""

TIMEOUT_ANNOTATION = "kinetic/timeout"
"""The Job's annotation naming its run-time limit in seconds (read back when Kubernetes
ends the Job at its deadline: :mod:`kinetic._core.k8s_status`)."""


def active_deadline(timeout: float) -> int:
    """The ``activeDeadlineSeconds`` of a Job whose function may run ``timeout`` seconds:
    a backstop to the runner's own limit, for a runner that cannot enforce it (native
    code that never lets Python run, a hung step before the function)."""
    return math.ceil(timeout) + DEADLINE_GRACE_S


REPLACES_LOST_PODS = "kinetic/replaces-lost-pods"
"""The annotation of a Job whose lost pods are replaced and counted by its runner (a
single job's: :func:`pod_failure_policy`); read back by :mod:`kinetic._core.k8s_status`
(a Kubernetes before 1.26 keeps annotations, not the policy)."""


def _lost_pods_not_replaced(manifest: dict[str, Any]) -> None:
    """Take out what lets a single job's Job replace its lost pods: a batch's Jobs leave
    a lost pod to their driver (a new Job per attempt) or to the pool's protocol."""
    del manifest["spec"]["podFailurePolicy"]
    del manifest["metadata"]["annotations"][REPLACES_LOST_PODS]
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [var for var in container["env"] if var["name"] != POD_ENV]


def pod_failure_policy() -> dict[str, Any]:
    """A job's ``podFailurePolicy``: a pod lost to a disruption (preemption, eviction, a
    node drained or gone: Kubernetes gives it a ``DisruptionTarget`` condition) counts
    towards ``backoffLimit``, and Kubernetes replaces it while the limit allows; a
    container that exited non-zero (the runner recorded the failure, or could not) fails
    the Job at once, never re-run. Rules apply in order; the first that matches wins.

    A Kubernetes before 1.26 ignores the field: it replaces a deleted pod by itself and
    counts a failed one towards ``backoffLimit``; the runner bounds the attempts either
    way (:mod:`runner.preemption`)."""
    return {
        "rules": [
            {
                "action": "Count",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
            },
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": CONTAINER_NAME,
                    "operator": "NotIn",
                    "values": [0],
                },
            },
        ]
    }


def job_manifest(template: JobTemplate, job_id: str) -> dict[str, Any]:
    """The ``batch/v1`` Job that runs job ``job_id``.

    :raises ConfigError: when the template's ``image`` or ``bucket`` is empty.
    """
    image, bucket, accelerator = template.image, template.bucket, template.accelerator
    if not image:
        raise ConfigError("a GKE job needs a container image")
    if not bucket:
        raise ConfigError("a GKE job needs a storage bucket")
    pod = template.pod or PodOptions()
    labels = {APP_LABEL: APP_VALUE, JOB_ID_LABEL: job_id}
    variables: dict[str, str] = {**(template.env or {}), **pod.extra_env}
    variables.update(
        {
            "JOB_ID": job_id,
            "KINETIC_STORAGE": f"gs://{bucket}",
            "KINETIC_BUCKET": bucket,
            "KINETIC_OUTPUT_DIR": template.output_dir,
            "JAX_PLATFORMS": accelerators.jax_platforms(accelerator),
            "PYTHONUNBUFFERED": "1",
            **store_plugins.RUNNER_ENV,  # the runner's gs:// store
        }
    )
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": image,
        "command": runner_command(bucket, job_id, python=template.python),
        "env": [{"name": k, "value": v} for k, v in sorted(variables.items())]
        + [{"name": POD_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "resources": container_resources(accelerator),
    }
    if pod.image_pull_policy is not None:
        container["imagePullPolicy"] = pod.image_pull_policy
    container["securityContext"] = container_security(accelerator)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
        # A job's pod gets no Kubernetes credentials unless it asked for them: with the
        # account's token, one job could delete, read or port-forward to the others.
        "automountServiceAccountToken": pod.api_access,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
    }
    selector = accelerators.node_selector(accelerator)
    if selector:
        pod_spec["nodeSelector"] = selector
    tolerations = accelerators.tolerations(accelerator)
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if pod.service_account:
        pod_spec["serviceAccountName"] = pod.service_account
    if pod.host_network:
        pod_spec["hostNetwork"] = True
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    if template.runner_image:
        runner_delivery.with_delivered_runner(
            pod_spec, template.runner_image, pull_policy=pod.image_pull_policy
        )
    secret_spec.apply_secrets(pod_spec, template.secrets, namespace=template.namespace)
    annotations = {
        "kinetic/accelerator": accelerator.name + (":spot" if accelerator.spot else ""),
        REPLACES_LOST_PODS: "true",
    }
    if template.func_name:
        annotations["kinetic/function"] = template.func_name
    job_spec: dict[str, Any] = {
        "backoffLimit": template.retries,
        "podFailurePolicy": pod_failure_policy(),
        "completions": 1,
        "parallelism": 1,
        "template": {"metadata": {"labels": labels}, "spec": pod_spec},
    }
    if template.timeout is not None:
        annotations[TIMEOUT_ANNOTATION] = f"{template.timeout:g}"
        job_spec["activeDeadlineSeconds"] = active_deadline(template.timeout)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(job_id),
            "namespace": template.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": job_spec,
    }


GROUP_ID_LABEL = "group-id"
GROUP_INDEX_LABEL = "group-index"
ATTEMPT_LABEL = "attempt"


def group_selector(group_id: str) -> str:
    """The label selector of every Job and pod of one batch."""
    return f"{SELECTOR},{GROUP_ID_LABEL}={group_id}"


def member_job_manifest(
    template: JobTemplate, *, group_id: str, index: int, attempt: int
) -> dict[str, Any]:
    """The Job running one attempt of input ``index`` of batch ``group_id``.

    Named ``kinetic-{attempt id}`` (:func:`runner.protocol.member_attempt_id`), so a
    re-creation on resume is a harmless ``409``; labelled with the batch, index and
    attempt, so one watch of the namespace shows the driver the whole batch.
    The template's ``output_dir`` is the batch's base: the input's is
    ``{output_dir}/{member job id}``.
    """
    member = member_job_id(group_id, index)
    attempt_id = member_attempt_id(group_id, index, attempt)
    own_output = f"{template.output_dir.rstrip('/')}/{member}"
    out = job_manifest(replace(template, output_dir=own_output, retries=0), attempt_id)
    _lost_pods_not_replaced(out)
    bucket = template.bucket
    extra = {GROUP_ID_LABEL: group_id, GROUP_INDEX_LABEL: str(index), ATTEMPT_LABEL: str(attempt)}
    out["metadata"]["labels"].update(extra)
    pod_template = out["spec"]["template"]
    pod_template["metadata"]["labels"] = dict(out["metadata"]["labels"])
    container = pod_template["spec"]["containers"][0]
    container["command"] = [
        template.python, "-m", "runner", "--storage", f"gs://{bucket}", "--group", group_id,
        "--index", str(index), "--attempt", str(attempt), "--upload-logs",
    ]  # fmt: skip
    for var in container["env"]:
        if var["name"] == "JOB_ID":
            var["value"] = member
    return out


GCS_FUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
GCS_FUSE_ANNOTATION = "gke-gcsfuse/volumes"


def with_gcs_fuse(manifest: Mapping[str, Any], buckets: Iterable[str]) -> dict[str, Any]:
    """``manifest`` with each bucket mounted read-only at ``{FUSE_ROOT}/{bucket}`` by the
    GCS FUSE CSI driver (the pod annotation asks GKE to inject the sidecar)."""
    out = copy.deepcopy(dict(manifest))
    template = out["spec"]["template"]
    names = sorted(set(buckets))
    if not names:
        return out
    template.setdefault("metadata", {}).setdefault("annotations", {})[GCS_FUSE_ANNOTATION] = "true"
    pod_spec = template["spec"]
    volumes = pod_spec.setdefault("volumes", [])
    mounts = pod_spec["containers"][0].setdefault("volumeMounts", [])
    for i, bucket in enumerate(names):
        name = f"gcs-fuse-{i}"
        volumes.append(
            {
                "name": name,
                "csi": {
                    "driver": GCS_FUSE_DRIVER,
                    "readOnly": True,
                    "volumeAttributes": {"bucketName": bucket, "mountOptions": "implicit-dirs"},
                },
            }
        )
        mounts.append({"name": name, "mountPath": f"{FUSE_ROOT}/{bucket}", "readOnly": True})
    return out


INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
POOL_GRACE_S = 15
"""Seconds a pool's worker pod has between SIGTERM and its kill when it is deleted
(``cancel()``; its ``terminationGracePeriodSeconds``, and the grace of the deletion):
the worker then ends its running input and writes the outcomes it buffered, a burst
write, waited out through a passing storage failure (:mod:`runner.pool`)."""
"""Where an Indexed Job's pod finds its completion index (the downward API)."""


def pool_job_name(group_id: str) -> str:
    """The Kubernetes name of a pool batch's one Job: ``kinetic-{group_id}``."""
    return f"kinetic-{group_id}"


def pool_job_manifest(template: JobTemplate, *, group_id: str, workers: int) -> dict[str, Any]:
    """The one ``batch/v1`` Job of a batch run by a worker pool (:mod:`runner.pool`).

    ``parallelism`` is the number of workers, each pod with the batch's accelerator.
    It is an Indexed Job of as many ``completions``: worker ``k`` (its completion index,
    ``KINETIC_WORKER_INDEX``) starts on the ``k``-th region of the inputs, so the
    workers' first claims never collide. The Job is complete once every index has a pod
    that exited 0 — a worker exits 0 only when every input has an outcome or the batch
    stopped. A worker that dies is replaced by a pod of the same index
    (``backoffLimit`` bounds how often), its claimed inputs taken over by another once
    its lease expires. Each pod knows its own name (``KINETIC_WORKER``, from the
    downward API): claims say which worker holds an input.

    A cluster without Indexed Jobs (Kubernetes before 1.21) drops ``completionMode``:
    the Job then completes once ``completions`` pods exited 0, the annotation is
    absent, ``KINETIC_WORKER_INDEX`` is empty, and each worker picks its first region
    at random (the protocol does not depend on the index; it only collides less).

    A deleted worker gets :data:`POOL_GRACE_S` seconds after SIGTERM to write the
    outcomes it buffered. A coordinated pool's workers also get the batch's token
    (:func:`kinetic._core.k8s_coordinated.with_token`).
    """
    out = job_manifest(template, group_id)
    bucket = template.bucket
    out["metadata"]["name"] = pool_job_name(group_id)
    out["metadata"]["labels"][GROUP_ID_LABEL] = group_id
    spec = out["spec"]
    spec["completions"] = spec["parallelism"] = max(1, workers)
    spec["completionMode"] = "Indexed"
    spec["backoffLimit"] = max(6, 2 * workers)  # a worker that dies, for any reason
    _lost_pods_not_replaced(out)
    pod_template = spec["template"]
    pod_template["metadata"]["labels"] = dict(out["metadata"]["labels"])
    pod_template["spec"]["terminationGracePeriodSeconds"] = POOL_GRACE_S
    container = pod_template["spec"]["containers"][0]
    container["command"] = [
        template.python, "-m", "runner.pool", "--storage", f"gs://{bucket}", "--group", group_id,
    ]  # fmt: skip
    container["env"] += [
        {"name": "KINETIC_WORKER", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "KINETIC_WORKER_INDEX", "valueFrom": {"fieldRef": {"fieldPath": INDEX_FIELD}}},
        # The pool's size, so that a worker spreads its start before its first read.
        {"name": "KINETIC_POOL_WORKERS", "value": str(spec["parallelism"])},
    ]
    return out
