"""``--preview`` of ``kinetic up`` and ``kinetic pool add|remove``: the plan, printed;
nothing is read from or changed in the cloud or the cluster (only the packaged CRD is
read, to name it).

``up`` creates only what is missing and keeps what exists (``kinetic status`` shows
which is which), so its plan lists everything it would make sure of.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kinetic._cli._output import EXIT_OK, emit_json


def up_plan(
    *,
    gke: bool,
    settings: Any,  # kinetic._core.config.Settings
    spec: Any,  # kinetic._infra.plan.SetupSpec
    pool: Mapping[str, Any] | None,
) -> list[str]:
    """What ``kinetic up`` would make sure of, in its order, one line each."""
    from kinetic._infra.ops import packaged_lws_crd
    from kinetic._infra.plan import desired_objects

    lines: list[str] = []
    if gke:
        lines.append(
            f"GKE cluster {settings.cluster} in {settings.zone} of project {settings.project}"
        )
        if pool is not None:
            lines.append(pool_line(pool, settings.cluster))
    lines += [str(ref) for ref, _ in desired_objects(spec, packaged_lws_crd())]
    if spec.bucket:
        lines.append(f"bucket gs://{spec.bucket}")
    if gke:
        lines.append(
            f"Artifact Registry repository {settings.region}-docker.pkg.dev/"
            f"{settings.project}/kinetic, and the pods' Google service account with access "
            "to the bucket and the repository (Workload Identity)"
        )
    return lines


def pool_line(pool: Mapping[str, Any], cluster: str) -> str:
    """One line describing the node pool ``pool`` (a ``NodePool`` body)."""
    config = pool.get("config") or {}
    scaling = pool.get("autoscaling") or {}
    parts = [config.get("machineType")]
    parts += [
        f"{a.get('acceleratorCount')}x {a.get('acceleratorType')}"
        for a in config.get("accelerators") or []
    ]
    if scaling:
        parts.append(f"{scaling.get('minNodeCount')}-{scaling.get('maxNodeCount')} nodes")
    elif pool.get("initialNodeCount") is not None:
        parts.append(f"{pool.get('initialNodeCount')} nodes")
    if config.get("spot"):
        parts.append("spot")
    detail = ", ".join(str(p) for p in parts if p)
    return f"node pool {pool['name']} in {cluster}" + (f" ({detail})" if detail else "")


def show(command: str, verb: str, lines: Sequence[str], json_out: bool = False) -> int:
    """Print the plan of ``command`` (``verb``: what it would do to each line's item)."""
    if json_out:
        emit_json({"preview": True, "command": command, "action": verb, "items": list(lines)})
        return EXIT_OK
    print(f"kinetic {command} would {verb}:")
    for line in lines:
        print(f"  {line}")
    print(f"(--preview: nothing was changed; run `kinetic {command}` without it to apply)")
    return EXIT_OK
