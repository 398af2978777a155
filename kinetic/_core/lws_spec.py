"""LeaderWorkerSet manifests for multi-host TPU jobs (the ``pathways`` backend). Pure.

A multi-host TPU slice is one job run by every host of the slice at once: a
LeaderWorkerSet (``leaderworkerset.x-k8s.io``) of one group whose ``size`` is the
slice's host count. The leader (host 0) and the workers (hosts 1..N-1) run the same
runner on the same job, in pods built exactly like a GKE job's pod
(:func:`kinetic._core.k8s_spec.job_manifest`: image, command, env, resources of one
host, node selector, tolerations, volumes), plus what a multi-host TPU program needs:

* ``TPU_WORKER_ID``: the host's index. The leader's is ``0``; the workers share one
  template, so theirs comes from the ``worker-index`` label the LWS controller puts on
  each pod (downward API).
* ``TPU_WORKER_HOSTNAMES``: every host's DNS name, in index order.
* ``MEGASCALE_COORDINATOR_ADDRESS``: the leader's DNS name.

DNS names follow the LWS controller's naming: the leader pod is ``{name}-0``, worker
``i`` is ``{name}-0-{i}``, all under the headless service ``{name}``.

Nothing re-runs a finished group: StatefulSet pods (which LWS uses) must have
``restartPolicy: Always``, so the group's ``restartPolicy`` is ``None`` (a restarted
container does not recreate the group), and the runner of a restarted container only
idles (``runner/_main.py``). A host's container therefore ends once, and its pod stays
until the LWS is deleted: an LWS has no TTL, so Kinetic deletes it when the job ends.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from kinetic._core import k8s_spec
from kinetic._core.accelerators import AcceleratorConfig
from kinetic._exceptions import AcceleratorError, ConfigError
from runner.protocol import HOST_ENV

GROUP = "leaderworkerset.x-k8s.io"
"""The API group of LeaderWorkerSet."""
KIND = "LeaderWorkerSet"
PLURAL = "leaderworkersets"

NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
GROUP_KEY_LABEL = "leaderworkerset.sigs.k8s.io/group-key"
"""Labels the LWS controller puts on every pod of a group."""

GROUP_RESTART_POLICY = "None"
"""The group is never recreated because one of its containers restarted."""
HOSTNAMES_ENV = "TPU_WORKER_HOSTNAMES"
COORDINATOR_ENV = "MEGASCALE_COORDINATOR_ADDRESS"
ROLE_LABEL = "kinetic/role"
"""``leader`` or ``worker``, on both templates (Kinetic's own label)."""

INSTALL_HINT = (
    "install LeaderWorkerSet (CRD and controller): kubectl apply --server-side -f "
    "https://github.com/kubernetes-sigs/lws/releases/download/v0.6.2/manifests.yaml "
    "(see https://lws.sigs.k8s.io/docs/installation/), or run single-host slices "
    "with backend='gke'"
)
"""How to fix a cluster without the LeaderWorkerSet CRD."""


def hosts_of(accelerator: AcceleratorConfig) -> int:
    """How many hosts (nodes) the accelerator spans: a TPU slice's node count, else 1."""
    return accelerator.num_nodes if accelerator.kind == "tpu" else 1


def choose_backend(resolved: str, accelerator: AcceleratorConfig, *, explicit: bool) -> str:
    """The backend of a job, given the settings' backend and the accelerator.

    With no backend asked for (``explicit`` False), a project-backed job on a
    multi-host TPU slice goes to ``pathways`` and every other one stays on ``gke``.
    The local backend is left to its own checks.

    :raises AcceleratorError: a multi-host slice asked of ``gke`` (one pod cannot span
        hosts), or ``pathways`` asked to run a CPU or GPU job.
    """
    hosts = hosts_of(accelerator)
    if resolved == "pathways" and accelerator.kind != "tpu":
        raise AcceleratorError(
            f"the pathways backend runs TPU slices; accelerator {accelerator.name!r} is a "
            f"{accelerator.kind.upper()} accelerator: use backend='gke' (or leave backend unset)"
        )
    if resolved == "gke" and hosts > 1:
        if explicit:
            raise AcceleratorError(
                f"accelerator {accelerator.name!r} is a multi-host TPU slice ({hosts} hosts): "
                "backend='gke' runs one pod on one node; use backend='pathways' "
                "(or leave backend unset), or a single-host slice"
            )
        return "pathways"
    return resolved


def lws_name(job_id: str) -> str:
    """The LeaderWorkerSet (and headless service) of a job: ``kinetic-{job_id}``."""
    return k8s_spec.job_name(job_id)


def host_dns_names(job_id: str, namespace: str, hosts: int) -> list[str]:
    """DNS names of the group's hosts in index order (leader first)."""
    name = lws_name(job_id)
    pods = [f"{name}-0"] + [f"{name}-0-{i}" for i in range(1, hosts)]
    return [f"{pod}.{name}.{namespace}" for pod in pods]


def pod_name(job_id: str, host: int) -> str:
    """The name the LWS controller gives host ``host``'s pod (group 0)."""
    name = lws_name(job_id)
    return f"{name}-0" if host == 0 else f"{name}-0-{host}"


def _with_env(container: dict[str, Any], extra: list[dict[str, Any]]) -> None:
    names = {e["name"] for e in extra}
    kept = [e for e in container.get("env") or [] if e["name"] not in names]
    container["env"] = kept + extra


def lws_manifest(
    job: Mapping[str, Any], *, accelerator: AcceleratorConfig, version: str
) -> dict[str, Any]:
    """The LeaderWorkerSet running ``job`` (a manifest from
    :func:`kinetic._core.k8s_spec.job_manifest`, volumes included) on every host of
    ``accelerator``'s slice.

    :param version: the served version of the LWS API (``v1``), found by discovery.
    :raises ConfigError: when ``job`` is not such a manifest.
    """
    try:
        meta = job["metadata"]
        template = job["spec"]["template"]
        job_id = meta["labels"][k8s_spec.JOB_ID_LABEL]
        namespace = meta["namespace"]
        containers = template["spec"]["containers"]
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"not a Kinetic Job manifest: missing {exc}") from None
    if not containers:
        raise ConfigError("not a Kinetic Job manifest: no container")
    hosts = hosts_of(accelerator)
    names = host_dns_names(job_id, namespace, hosts)
    common = [
        {"name": HOSTNAMES_ENV, "value": ",".join(names)},
        {"name": COORDINATOR_ENV, "value": names[0]},
    ]

    def pod_template(role: str, worker_id: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(dict(template))
        out.setdefault("metadata", {})
        out["metadata"]["labels"] = {**out["metadata"].get("labels", {}), ROLE_LABEL: role}
        spec = out["spec"]
        spec["restartPolicy"] = "Always"  # StatefulSet pods must; the runner never re-runs
        _with_env(spec["containers"][0], [*common, {"name": HOST_ENV, **worker_id}])
        return out

    leader = pod_template("leader", {"value": "0"})
    worker = pod_template(
        "worker",
        {"valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{WORKER_INDEX_LABEL}']"}}},
    )
    labels = dict(meta.get("labels") or {})
    annotations = {**(meta.get("annotations") or {}), "kinetic/hosts": str(hosts)}
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": KIND,
        "metadata": {
            "name": lws_name(job_id),
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "replicas": 1,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": hosts,
                "restartPolicy": GROUP_RESTART_POLICY,
                "leaderTemplate": leader,
                "workerTemplate": worker,
            },
        },
    }


def host_of_pod(pod: Mapping[str, Any]) -> int | None:
    """The host index of a group's pod, from its ``worker-index`` label (None if absent)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    raw = labels.get(WORKER_INDEX_LABEL)
    return int(raw) if isinstance(raw, str) and raw.isdigit() else None


def host_of_pod_name(job_id: str, name: str) -> int | None:
    """The host index of a pod named as the LWS controller names group 0's pods."""
    base = f"{lws_name(job_id)}-0"
    if name == base:
        return 0
    rest = name.removeprefix(f"{base}-")
    return int(rest) if rest != name and rest.isdigit() else None
