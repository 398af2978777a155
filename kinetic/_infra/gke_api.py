"""The GKE Container REST API (v1), as pure requests and readings of its answers.

No IO: every function here builds an :class:`ApiRequest` or reads a JSON document
the API returned, so the shapes are unit-tested without a network or a loop. The
shapes follow the API's reference: clusters and node pools under
``projects/{project}/locations/{location}``, long calls answered with an
``Operation`` (``status`` ``PENDING`` / ``RUNNING`` / ``DONE`` / ``ABORTING``, an
``error`` when it failed) that is polled at ``operations/{name}``, and errors as
``{"error": {"code", "message", "status"}}``.

Node pools are made from the accelerator catalog (:mod:`kinetic._core.accelerators`):
the machine type, the GPUs, the TPU slice topology, spot VMs (with the
``cloud.google.com/gke-spot=true:NoSchedule`` taint Kinetic's pods tolerate, so that
jobs that did not ask for spot never land there). Everything Kinetic creates carries
the resource label ``managed-by=kinetic``; ``down`` deletes a cluster only when it
carries it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kinetic._core.accelerators import (
    LABEL_SPOT,
    AcceleratorConfig,
    parse_accelerator,
)
from kinetic._exceptions import ConfigError

CONTAINER_API = "https://container.googleapis.com"
RESOURCE_LABEL = "managed-by"
RESOURCE_LABEL_VALUE = "kinetic"
OAUTH_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
DEFAULT_MACHINE_TYPE = "e2-standard-4"
DEFAULT_POOL = "default-pool"
_CPU_SIZES = (2, 4, 8, 16, 32, 64)
_POOL_NAME = re.compile(r"[a-z](?:[-a-z0-9]{0,38}[a-z0-9])?")


@dataclass(frozen=True)
class ApiRequest:
    """One Container API call: method, path under the API root, JSON body."""

    method: str
    path: str
    body: dict[str, Any] | None = field(default=None, compare=True)
    what: str = ""


def _loc(project: str, location: str) -> str:
    if not project or not location:
        raise ConfigError("GKE needs a project and a zone: --project/--zone or KINETIC_PROJECT")
    return f"/v1/projects/{project}/locations/{location}"


def get_cluster(project: str, location: str, cluster: str) -> ApiRequest:
    return ApiRequest(
        "GET", f"{_loc(project, location)}/clusters/{cluster}", what=f"get cluster {cluster}"
    )


def list_clusters(project: str) -> ApiRequest:
    """The project's clusters in every location (the API's ``-`` wildcard)."""
    return ApiRequest("GET", f"{_loc(project, '-')}/clusters", what=f"list clusters of {project}")


def delete_cluster(project: str, location: str, cluster: str) -> ApiRequest:
    return ApiRequest(
        "DELETE", f"{_loc(project, location)}/clusters/{cluster}", what=f"delete cluster {cluster}"
    )


def create_cluster(
    project: str,
    location: str,
    cluster: str,
    *,
    machine_type: str = DEFAULT_MACHINE_TYPE,
    min_nodes: int = 1,
    max_nodes: int = 3,
) -> ApiRequest:
    """Create a cluster with one autoscaled CPU pool (``default-pool``) for the system
    pods and CPU jobs, Workload Identity (pods reach GCS as a Google service account)
    and the GCS FUSE CSI driver (``Data(..., fuse=True)``)."""
    check_node_counts(min_nodes, max_nodes)
    pool = {
        "name": DEFAULT_POOL,
        "initialNodeCount": max(1, min_nodes),
        "config": {
            "machineType": machine_type,
            "oauthScopes": list(OAUTH_SCOPES),
            "resourceLabels": {RESOURCE_LABEL: RESOURCE_LABEL_VALUE},
            "workloadMetadataConfig": {"mode": "GKE_METADATA"},
        },
        "autoscaling": {"enabled": True, "minNodeCount": min_nodes, "maxNodeCount": max_nodes},
        "management": {"autoRepair": True, "autoUpgrade": True},
    }
    body = {
        "cluster": {
            "name": cluster,
            "resourceLabels": {RESOURCE_LABEL: RESOURCE_LABEL_VALUE},
            "nodePools": [pool],
            "workloadIdentityConfig": {"workloadPool": f"{project}.svc.id.goog"},
            "addonsConfig": {"gcsFuseCsiDriverConfig": {"enabled": True}},
            "releaseChannel": {"channel": "REGULAR"},
        }
    }
    return ApiRequest(
        "POST", f"{_loc(project, location)}/clusters", body, what=f"create cluster {cluster}"
    )


def list_pools(project: str, location: str, cluster: str) -> ApiRequest:
    return ApiRequest(
        "GET",
        f"{_loc(project, location)}/clusters/{cluster}/nodePools",
        what=f"list node pools of {cluster}",
    )


def create_pool(project: str, location: str, cluster: str, pool: Mapping[str, Any]) -> ApiRequest:
    return ApiRequest(
        "POST",
        f"{_loc(project, location)}/clusters/{cluster}/nodePools",
        {"nodePool": dict(pool)},
        what=f"create node pool {pool['name']} in {cluster}",
    )


def delete_pool(project: str, location: str, cluster: str, pool: str) -> ApiRequest:
    return ApiRequest(
        "DELETE",
        f"{_loc(project, location)}/clusters/{cluster}/nodePools/{pool}",
        what=f"delete node pool {pool} of {cluster}",
    )


def get_operation(project: str, location: str, operation: str) -> ApiRequest:
    return ApiRequest(
        "GET",
        f"{_loc(project, location)}/operations/{operation}",
        what=f"get operation {operation}",
    )


# --------------------------------------------------------------------------- node pools


def check_node_counts(min_nodes: int, max_nodes: int) -> None:
    """:raises ConfigError: unless ``0 <= min_nodes <= max_nodes`` and ``max_nodes >= 1``."""
    if min_nodes < 0 or max_nodes < 1 or min_nodes > max_nodes:
        raise ConfigError(
            f"node counts must satisfy 0 <= min ({min_nodes}) <= max ({max_nodes}) and max >= 1"
        )


def pool_name(accelerator: AcceleratorConfig) -> str:
    """The default name of the pool serving ``accelerator`` (``kn-gpu-l4x4-spot``)."""
    base = re.sub(r"[^a-z0-9]+", "-", f"kn-{accelerator.name}".lower()).strip("-")
    suffix = "-spot" if accelerator.spot else ""
    return base[: 40 - len(suffix)].rstrip("-") + suffix


def check_pool_name(name: str) -> str:
    """:raises ConfigError: unless ``name`` is a valid node pool name (1-40 characters)."""
    if not _POOL_NAME.fullmatch(name):
        raise ConfigError(
            f"invalid node pool name {name!r}: 1-40 lower-case letters, digits and '-', "
            "starting with a letter"
        )
    return name


def _cpu_machine(accelerator: AcceleratorConfig) -> str:
    cpus = getattr(accelerator, "cpus", None)
    if cpus is None:
        return DEFAULT_MACHINE_TYPE
    # The node also runs GKE's own pods: leave room beside the job's CPUs.
    for size in _CPU_SIZES:
        if size > cpus:
            return f"e2-standard-{size}" if size <= 32 else f"n2-standard-{size}"
    raise ConfigError(f"no machine type in the catalog has more than {cpus} CPUs")


def node_pool(
    accelerator: str | AcceleratorConfig,
    *,
    min_nodes: int | None = None,
    max_nodes: int | None = None,
    spot: bool = False,
    name: str | None = None,
    machine_type: str | None = None,
) -> dict[str, Any]:
    """The ``NodePool`` body for an accelerator of the catalog.

    A single-host pool autoscales between ``min_nodes`` (default 0) and ``max_nodes``
    (default 1) nodes. A multi-host TPU slice is one pool of exactly the slice's hosts
    (GKE scales it as a whole): its counts, when given, must be 0 or that number.

    :raises AcceleratorError: unknown accelerator.
    :raises ConfigError: impossible node counts or pool name.
    """
    cfg = parse_accelerator(accelerator, spot=spot) if isinstance(accelerator, str) else accelerator
    if spot and not cfg.spot:
        cfg = parse_accelerator(cfg.name, spot=True)
    config: dict[str, Any] = {
        "oauthScopes": list(OAUTH_SCOPES),
        "resourceLabels": {RESOURCE_LABEL: RESOURCE_LABEL_VALUE},
        "workloadMetadataConfig": {"mode": "GKE_METADATA"},
    }
    body: dict[str, Any] = {
        "name": check_pool_name(name or pool_name(cfg)),
        "config": config,
        "management": {"autoRepair": True, "autoUpgrade": True},
    }
    hosts = 1
    if cfg.kind == "gpu":
        config["machineType"] = machine_type or cfg.machine_type
        config["accelerators"] = [
            {
                "acceleratorCount": str(cfg.count),
                "acceleratorType": cfg.gke_label,
                "gpuDriverInstallationConfig": {"gpuDriverVersion": "DEFAULT"},
            }
        ]
    elif cfg.kind == "tpu":
        config["machineType"] = machine_type or cfg.machine_type
        hosts = cfg.num_nodes
        if hosts > 1:
            body["placementPolicy"] = {"type": "COMPACT", "tpuTopology": cfg.topology}
    else:
        config["machineType"] = machine_type or _cpu_machine(cfg)
    if cfg.spot:
        config["spot"] = True
        config["taints"] = [{"key": LABEL_SPOT, "value": "true", "effect": "NO_SCHEDULE"}]
    if hosts > 1:
        for given in (min_nodes, max_nodes):
            if given not in (None, 0, hosts):
                raise ConfigError(
                    f"{cfg.name} is a multi-host slice of {hosts} nodes, created and scaled "
                    f"as a whole: --min-nodes/--max-nodes must be 0 or {hosts}"
                )
        low = 0 if min_nodes is None else min_nodes
        body["initialNodeCount"] = hosts  # a slice is created whole (it may scale to 0)
        body["autoscaling"] = {"enabled": True, "minNodeCount": low, "maxNodeCount": hosts}
    else:
        low = 0 if min_nodes is None else min_nodes
        high = max(1, low) if max_nodes is None else max_nodes
        check_node_counts(low, high)
        body["initialNodeCount"] = low
        body["autoscaling"] = {"enabled": True, "minNodeCount": low, "maxNodeCount": high}
    return body


# --------------------------------------------------------------------------- answers


@dataclass(frozen=True)
class Operation:
    """A long-running call's state.

    :ivar name: the operation's id (polled at ``operations/{name}``).
    :ivar done: it finished (successfully when ``error`` is None).
    :ivar status: the API's status word.
    :ivar error: what went wrong, when it failed.
    :ivar kind: the operation type (``CREATE_CLUSTER``, ...).
    """

    name: str
    done: bool
    status: str
    error: str | None = None
    kind: str = ""


def parse_operation(doc: Mapping[str, Any]) -> Operation:
    """Read an ``Operation``.

    :raises ValueError: it has no name (not an operation).
    """
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"not an operation: {json.dumps(doc)[:200]}")
    status = str(doc.get("status") or "STATUS_UNSPECIFIED")
    err = doc.get("error") or {}
    message = err.get("message") if isinstance(err, Mapping) else None
    if status == "ABORTING" and not message:
        message = str(doc.get("statusMessage") or "the operation was aborted")
    return Operation(
        name=name,
        done=status == "DONE",
        status=status,
        error=str(message) if message else None,
        kind=str(doc.get("operationType") or ""),
    )


@dataclass(frozen=True)
class PoolInfo:
    """A node pool, as ``kinetic pool list`` shows it."""

    name: str
    machine_type: str
    accelerator: str | None
    min_nodes: int | None
    max_nodes: int | None
    spot: bool
    status: str
    managed: bool
    topology: str | None = None
    service_account: str = "default"
    """The nodes' Google service account (``default``: the project's Compute Engine one)."""


def parse_pool(doc: Mapping[str, Any]) -> PoolInfo:
    """Read a ``NodePool``."""
    config = doc.get("config") or {}
    accelerators = config.get("accelerators") or []
    accel = None
    if accelerators:
        a = accelerators[0]
        accel = f"{a.get('acceleratorType')} x{a.get('acceleratorCount')}"
    elif str(config.get("machineType", "")).startswith("ct"):
        accel = "tpu"
    autoscaling = doc.get("autoscaling") or {}
    enabled = bool(autoscaling.get("enabled"))
    count = doc.get("initialNodeCount")
    return PoolInfo(
        name=str(doc.get("name")),
        machine_type=str(config.get("machineType") or "-"),
        accelerator=accel,
        min_nodes=int(autoscaling.get("minNodeCount", 0)) if enabled else _int(count),
        max_nodes=int(autoscaling.get("maxNodeCount", 0)) if enabled else _int(count),
        spot=bool(config.get("spot") or config.get("preemptible")),
        status=str(doc.get("status") or "-"),
        managed=(config.get("resourceLabels") or {}).get(RESOURCE_LABEL) == RESOURCE_LABEL_VALUE,
        topology=(doc.get("placementPolicy") or {}).get("tpuTopology"),
        service_account=str(config.get("serviceAccount") or "default"),
    )


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class ClusterInfo:
    """A cluster, as ``kinetic status`` shows it and the kubeconfig needs it."""

    name: str
    status: str
    location: str
    endpoint: str | None
    ca_certificate: str | None
    version: str | None
    managed: bool
    pools: tuple[PoolInfo, ...] = ()


def parse_cluster(doc: Mapping[str, Any]) -> ClusterInfo:
    """Read a ``Cluster``."""
    return ClusterInfo(
        name=str(doc.get("name")),
        status=str(doc.get("status") or "-"),
        location=str(doc.get("location") or doc.get("zone") or "-"),
        endpoint=doc.get("endpoint") or None,
        ca_certificate=(doc.get("masterAuth") or {}).get("clusterCaCertificate") or None,
        version=doc.get("currentMasterVersion") or None,
        managed=(doc.get("resourceLabels") or {}).get(RESOURCE_LABEL) == RESOURCE_LABEL_VALUE,
        pools=tuple(parse_pool(p) for p in doc.get("nodePools") or []),
    )


def error_message(status: int, body: bytes) -> tuple[str, str]:
    """``(status word, message)`` of an error answer (``NOT_FOUND``, ``...``)."""
    try:
        doc = json.loads(body)
        err = doc.get("error") or {}
        return str(err.get("status") or ""), str(err.get("message") or "").strip()
    except (ValueError, AttributeError):
        return "", body[:200].decode(errors="replace").strip()


def kubeconfig(cluster: ClusterInfo, token: str) -> dict[str, Any]:
    """A kubeconfig (JSON is YAML) reaching ``cluster`` with a Google access token,
    for the in-cluster part of one command (the token is short-lived: never kept).

    :raises ConfigError: the cluster has no endpoint yet (still provisioning).
    """
    if not cluster.endpoint or not cluster.ca_certificate:
        raise ConfigError(f"cluster {cluster.name} has no endpoint yet (status {cluster.status})")
    name = f"gke-{cluster.name}"
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": name,
                "cluster": {
                    "server": f"https://{cluster.endpoint}",
                    "certificate-authority-data": cluster.ca_certificate,
                },
            }
        ],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }
