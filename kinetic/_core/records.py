"""The durable description of a job: plain, JSON-serializable data. Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Self, TypedDict

from runner import protocol


def utcnow_iso() -> str:
    """An ISO 8601 UTC timestamp without fractional seconds, as the original writes."""
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


@dataclasses.dataclass(eq=True)
class JobRecord:
    """Everything needed to observe, collect and clean up a job from any process.

    No function object or closure state is kept: only names and locations.
    ``bucket_name`` is the GCS bucket, or for the local backend the storage directory.
    """

    job_id: str
    backend: str
    project: str
    cluster_name: str
    zone: str
    namespace: str
    bucket_name: str
    k8s_name: str
    image_uri: str
    accelerator: str
    func_name: str
    display_name: str
    created_at: str
    group_id: str | None = None
    group_kind: str | None = None
    group_index: int | None = None
    debug: bool = False

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(JobRecord))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Self:
        """Rebuild from :meth:`to_dict` output; unknown keys (from newer versions) are ignored.

        :raises TypeError: when a required field is missing.
        """
        names = cls.field_names()
        return cls(**{k: v for k, v in d.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict of the set fields."""
        return {
            name: getattr(self, name)
            for name in self.field_names()
            if getattr(self, name) is not None
        }

    def record(self) -> JobRecord:
        """The plain record (without the subclass's behaviour)."""
        return JobRecord(**{name: getattr(self, name) for name in self.field_names()})


# -- what single jobs and batches write alike ----------------------------------------


def job_spec(
    *,
    job_id: str,
    func_name: str,
    payload_sha256: str,
    context_sha256: str,
    cwd: str | None,
    sys_path: list[str],
    env: Mapping[str, str],
    output_dir: str,
    has_data: bool,
    install: Sequence[str] = (),
    install_kept: Sequence[str] = (),
) -> protocol.JobSpec:
    """The spec the runner reads (``protocol.JobSpec``), for a single job or, under the
    group's id, for every input of a batch."""
    spec: protocol.JobSpec = {
        "format": protocol.FORMAT,
        "job_id": job_id,
        "func_name": func_name,
        "payload_sha256": payload_sha256,
        "context_key": protocol.context_key(context_sha256),
        "context_sha256": context_sha256,
        "cwd": cwd,
        "sys_path": sys_path,
        "env": dict(env),
        "output_dir": output_dir,
        "has_data": has_data,
        "python": protocol.python_version(),  # where the payload's code can load
    }
    if install:
        spec["install"] = list(install)
    if install_kept:
        spec["install_kept"] = list(install_kept)
    return spec


def shared_handle(
    *,
    backend: str,
    project: str,
    bucket_name: str,
    cluster_name: str,
    zone: str,
    namespace: str,
    image_uri: str,
    accelerator: str,
    func_name: str,
    debug: bool,
) -> protocol.BatchHandleRecord:
    """The handle fields a job shares with the other inputs of its batch (a batch's
    manifest keeps them once), stamped now."""
    return {
        "backend": backend,
        "project": project,
        "bucket_name": bucket_name,
        "cluster_name": cluster_name,
        "zone": zone,
        "namespace": namespace,
        "image_uri": image_uri,
        "accelerator": accelerator,
        "func_name": func_name,
        "created_at": utcnow_iso(),
        "debug": debug,
    }


class JobNames(TypedDict):
    k8s_name: str
    display_name: str


def job_names(job_id: str, func_name: str) -> JobNames:
    """A job's Kubernetes object name and its display name."""
    return {"k8s_name": f"kinetic-{job_id}", "display_name": f"kinetic-{func_name}-{job_id}"}
