"""The durable description of a job: plain, JSON-serializable data. Pure."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any, Self


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
