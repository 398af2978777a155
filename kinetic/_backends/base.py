"""The narrow interface between job orchestration and the places jobs run.

A backend launches a job whose artifacts are already in its storage, observes
it, and ends it. It never unpickles anything: result payloads are the job
engine's business. Every method is a coroutine bounded by a timeout (its own
default or an argument) and raises only Kinetic errors.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

import anyio

from kinetic._core.status import StatusReport
from kinetic._storage.base import Storage

StatusCallback = Callable[[StatusReport], Awaitable[None]]


class JobRef(Protocol):
    """What a backend needs to know about a job (a JobHandle satisfies it)."""

    @property
    def job_id(self) -> str: ...

    @property
    def k8s_name(self) -> str: ...

    @property
    def namespace(self) -> str: ...

    @property
    def group_id(self) -> str | None: ...

    @property
    def group_index(self) -> int | None: ...


class Backend(Protocol):
    """Runs jobs and reports on them."""

    @property
    def name(self) -> str:
        """``"local"``, ``"gke"`` or ``"pathways"``."""
        ...

    @property
    def storage(self) -> Storage:
        """Where this backend's jobs keep their objects."""
        ...

    async def launch(self, job: JobRef) -> None:
        """Start the job. Its spec, payload and handle are already stored.

        :raises BackendError: when it cannot be started; nothing keeps running then.
        """
        ...

    async def status(self, job: JobRef) -> StatusReport:
        """The job's current status, with the reason when it failed or is stuck."""
        ...

    async def wait(self, job: JobRef, on_change: StatusCallback | None = None) -> StatusReport:
        """Wait, without wall-clock polling where an event exists, until the job is terminal.

        ``on_change`` is awaited with each distinct status observed, the first included.
        Cancelling the wait does not affect the job.
        """
        ...

    async def logs(self, job: JobRef, *, tail: int | None = None) -> str:
        """The job's output so far (the last ``tail`` lines when given)."""
        ...

    def follow_logs(self, job: JobRef, finished: anyio.Event | None = None) -> AsyncIterator[str]:
        """Yield output as it is written, from the start, until the job ends.

        ``finished``, when given, is set by a caller that already saw the job end: the
        stream then reads what is left and stops at once.
        """
        ...

    async def cancel(self, job: JobRef) -> None:
        """End the job if it is still running. Idempotent."""
        ...

    async def read_result(self, job: JobRef) -> bytes:
        """The job's pickled result payload.

        :raises ObjectNotFoundError: when the job has not recorded one.
        """
        ...

    async def delete_objects(self, job: JobRef) -> None:
        """Delete what the job stored. Shared, content-addressed artifacts are kept."""
        ...

    async def list_job_ids(self) -> list[str]:
        """Ids of the jobs this backend knows (live or recorded)."""
        ...

    async def aclose(self) -> None:
        """Release connections and background watches."""
        ...


async def logs_once_over(
    backend: Backend, job: JobRef, finished: anyio.Event | None
) -> AsyncIterator[str]:
    """A batch input's whole output, once the input is over.

    Batch inputs share workers (locally) or store their output when their pod ends
    (GKE): there is no live stream of one input, so followers get it in one piece.
    """
    if finished is not None:
        await finished.wait()
    else:
        await backend.wait(job)
    yield await backend.logs(job)
