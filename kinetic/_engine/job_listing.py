"""What ``list_jobs`` lists: the recorded single jobs (newest first, each unreadable
handle skipped with a warning), or one batch's inputs, a page at a time."""

from __future__ import annotations

import logging

import anyio

from kinetic._backends.base import Backend
from kinetic._core.arg_checks import check_count
from kinetic._core.exception_groups import one_error
from kinetic._core.ids import check_group_id
from kinetic._engine.batch import member_job
from kinetic._engine.handle import JobHandle, load_handle
from kinetic._exceptions import JobNotFoundError, ObjectNotFoundError
from runner import protocol

log = logging.getLogger(__name__)

_LOAD_CONCURRENCY = 32


async def single_jobs(target: Backend) -> list[JobHandle]:
    """The handles of the single jobs recorded in ``target``'s storage, newest first.

    A job deleted meanwhile is left out; one whose handle cannot be read (corrupted, or
    storage refused it) is left out with a warning naming it, so one broken record does
    not hide the others.
    """
    ids = iter(await target.list_job_ids())
    handles: list[JobHandle] = []

    async def load_some() -> None:
        # A few loaders share the ids, rather than a task per job: thousands of jobs
        # would start thousands of tasks in one step of the caller's loop.
        for job_id in ids:
            try:
                handles.append(await load_handle(target, job_id))
            except JobNotFoundError:
                continue  # deleted since it was listed
            except Exception as exc:  # noqa: BLE001 - one broken record must not hide the rest
                log.warning(
                    "list_jobs: skipping job %s: its handle cannot be read: %s", job_id, exc
                )

    with one_error():
        async with anyio.create_task_group() as tg:
            for _ in range(_LOAD_CONCURRENCY):
                tg.start_soon(load_some)
    return sorted(handles, key=lambda h: (h.created_at, h.job_id), reverse=True)


async def batch_inputs(
    target: Backend, group_id: str, *, offset: int = 0, limit: int | None = None
) -> tuple[list[JobHandle], int]:
    """Handles of batch ``group_id``'s inputs ``offset`` to ``offset + limit`` (all the
    rest when ``limit`` is None), in input order, and the batch's number of inputs.

    Built from the batch's manifest alone: one read, whatever the page's size.

    :raises ConfigError: a malformed group id, or a negative offset or limit.
    :raises JobNotFoundError: no such batch.
    """
    check_group_id(group_id)
    check_count("offset", offset)
    if limit is not None:
        check_count("limit", limit)
    try:
        manifest: protocol.BatchManifest = protocol.load_json(
            await target.storage.read(protocol.group_manifest_key(group_id))
        )
    except ObjectNotFoundError:
        raise JobNotFoundError(f"no batch {group_id!r} in {target.storage.url}") from None
    total = int(manifest["total"])
    stop = total if limit is None else min(total, offset + limit)
    return [member_job(manifest, i) for i in range(offset, stop)], total
