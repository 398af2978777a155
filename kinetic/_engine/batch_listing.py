"""The batches recorded in a store: a summary of each committed manifest, newest first.

Shared by ``kinetic batch list`` and the dashboard. A manifest that is gone (its batch
being deleted) or is not a JSON object (damaged) is skipped: one bad record must not
hide the others.
"""

from __future__ import annotations

from typing import Any

from kinetic._concurrency import for_each
from kinetic._exceptions import ObjectNotFoundError
from kinetic._storage.base import Storage
from runner import protocol

SUMMARY_KEYS = ("group_id", "name", "func_name", "total", "created_at", "tags")
"""What a summary holds of a manifest."""
_CONCURRENCY = 16


async def batch_summaries(storage: Storage) -> list[dict[str, Any]]:
    """A summary (:data:`SUMMARY_KEYS`) of every committed batch in ``storage``, newest
    first (``created_at`` as a string; ties by group id).

    :raises StorageError: a listing or a read the storage refused.
    """
    keys = [k async for k in storage.list("_groups/") if k.endswith("/manifest.json")]
    found: list[dict[str, Any]] = []

    async def one(key: str) -> None:
        try:
            manifest = protocol.load_json(await storage.read(key))
        except (ObjectNotFoundError, ValueError):
            return
        if isinstance(manifest, dict):
            summary = {k: manifest.get(k) for k in SUMMARY_KEYS}
            summary["created_at"] = str(summary["created_at"] or "")
            found.append(summary)

    await for_each(keys, one, limit=_CONCURRENCY)
    return sorted(found, key=lambda m: (m["created_at"], str(m["group_id"])), reverse=True)
