"""The Kubernetes objects of a coordinated pool batch (``docs/pool-protocol.md``, "The
coordinated pool"). Pure.

Besides the workers' Job (:func:`kinetic._core.k8s_spec.pool_job_manifest`, whose pods
get the batch's token), a coordinated batch has

* a Secret that holds the batch's token (:func:`token_secret`): the coordinator and
  every worker read it from their environment (:func:`token_env`), and a connection
  whose peer does not prove it is refused (:mod:`runner.pool.coordinator.wire`);
* the coordinator's Job (:func:`coordinator_job_manifest`): one pod with no
  accelerator, listening on its pod's address only, which it records in storage for
  the workers. A coordinator that dies is replaced by the Job (a new pod, the next epoch,
  which reads the commits and carries on).

Every object carries the batch's labels: cancel and release delete them with the pool.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping
from typing import Any, Final

from kinetic._core import accelerators, k8s_spec, k8s_status
from kinetic._core.status import JobStatus
from runner.pool.coordinator.wire import TOKEN_ENV

TOKEN_KEY: Final = "token"
COORDINATOR_BACKOFF: Final = 6
"""Coordinator pods the Job replaces at most (each restart is an epoch)."""
COORDINATOR_CPU: Final = "250m"
COORDINATOR_MEMORY: Final = "512Mi"


def token_secret_name(group_id: str) -> str:
    return f"kinetic-{group_id}-token"


def coordinator_job_name(group_id: str) -> str:
    return f"kinetic-{group_id}-coordinator"


def _labels(group_id: str) -> dict[str, str]:
    return {
        k8s_spec.APP_LABEL: k8s_spec.APP_VALUE,
        k8s_spec.JOB_ID_LABEL: group_id,
        k8s_spec.GROUP_ID_LABEL: group_id,
    }


def token_secret(group_id: str, token: str) -> dict[str, Any]:
    """The Secret that holds the batch's token (hex)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": token_secret_name(group_id), "labels": _labels(group_id)},
        "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def token_env(group_id: str) -> dict[str, Any]:
    """The container variable that reads the batch's token from its Secret."""
    ref = {"name": token_secret_name(group_id), "key": TOKEN_KEY}
    return {"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": ref}}


def coordinator_failure(job: Mapping[str, Any] | None) -> str | None:
    """Why the coordinator's Job failed (its pods kept dying: the batch cannot go on,
    whatever its workers do), or None."""
    if job is None:
        return None
    report = k8s_status.job_conditions_report(job)
    if report is None or report.status is not JobStatus.FAILED:
        return None
    return f"the pool's coordinator failed: {report.reason}"


def with_token(pool_job: dict[str, Any], group_id: str) -> dict[str, Any]:
    """The workers' Job (:func:`~kinetic._core.k8s_spec.pool_job_manifest`) of a
    coordinated pool: its pods read the batch's token, so they run what its coordinator
    hands them."""
    pool_job["spec"]["template"]["spec"]["containers"][0]["env"].append(token_env(group_id))
    return pool_job


def coordinator_job_manifest(
    template: k8s_spec.JobTemplate, *, group_id: str, host: str | None = None
) -> dict[str, Any]:
    """The coordinator's ``batch/v1`` Job: the batch's image, none of the user's Secrets
    or volumes (it runs no user code), asking for no accelerator but tolerating the
    taints of the batch's accelerator nodes: it runs on any node, one of its workers'
    too (a cluster of accelerator nodes only has no other place for it). It listens
    on its pod's address, or on ``host`` (``KINETIC_GKE_COORDINATOR_HOST``: a one-node
    cluster whose pods share the host's network listens on loopback).

    :raises ConfigError: as :func:`kinetic._core.k8s_spec.job_manifest`.
    """
    cpu = accelerators.parse_accelerator("cpu")
    plain = dataclasses.replace(template, accelerator=cpu, secrets=(), timeout=None, retries=0)
    out = k8s_spec.job_manifest(plain, group_id)
    out["metadata"]["name"] = coordinator_job_name(group_id)
    out["metadata"]["labels"] = _labels(group_id)
    spec = out["spec"]
    spec["backoffLimit"] = COORDINATOR_BACKOFF
    spec.pop("podFailurePolicy", None)  # a coordinator that crashed is replaced
    pod_template = spec["template"]
    pod_template["metadata"]["labels"] = _labels(group_id)
    pod_spec = pod_template["spec"]
    pod_spec["terminationGracePeriodSeconds"] = k8s_spec.POOL_GRACE_S
    tolerations = accelerators.tolerations(template.accelerator)
    if tolerations:
        pod_spec["tolerations"] = tolerations
    container = pod_spec["containers"][0]
    container["command"] = [
        template.python, "-m", "runner.pool.coordinator",
        "--storage", f"gs://{template.bucket}", "--group", group_id,
        "--host", host or "$(KINETIC_POD_IP)",
    ]  # fmt: skip
    container["env"] += [
        {"name": "KINETIC_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        token_env(group_id),
    ]
    container["resources"] = {
        "requests": {"cpu": COORDINATOR_CPU, "memory": COORDINATOR_MEMORY},
        "limits": {"memory": COORDINATOR_MEMORY},
    }
    return out
