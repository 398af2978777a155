"""What the job engine needs from the engine running a batch, and one input of a batch
answered over it.

:class:`~kinetic._backends.base.BatchRunner` is the narrow interface (a backend's
``batch_runner``); two backends implement it:

* the local backend's :class:`~kinetic._backends.local_batch.LocalBatchRunner` wraps
  its detached supervisor: events come from its socket while it runs, from its results
  logs otherwise, and a batch nobody drives gets a new supervisor.
* the GKE backend's :class:`~kinetic._backends.gke.pool.GKEBatchEngines` hands each
  batch to the engine its manifest names: a worker pool on one Kubernetes Job that
  needs no client (:mod:`kinetic._backends.gke.pool`, the default), or one Job per
  input driven inside the consumer's awaits (:mod:`kinetic._backends.gke.batch`,
  ``pod_per_input=True``).

Both follow the same storage protocol for the stop marker (``stop.json``): once a
batch stopped and nothing of it runs, every input without an outcome never ran.

:class:`BatchInput` answers what a :class:`~kinetic._engine.handle.JobHandle` asks of
one input — status, waiting, logs, cancel, result — once for every engine, with the
rules of :mod:`kinetic._core.status`: the input's outcome settles it, then its batch's
stop record; otherwise its engine says whether it is at work.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio

from kinetic._backends.base import (
    BatchEvents,
    BatchRunner,
    InputActivity,
    JobRef,
    Loaded,
    StatusCallback,
    input_index,
)
from kinetic._backends.local_batch import LocalBatchRunner
from kinetic._core.status import (
    StatusReport,
    settled_input_report,
    summarized_input_report,
    unsettled_input_report,
)
from kinetic._exceptions import BackendError, ObjectNotFoundError
from runner import protocol

__all__ = [
    "BatchEvents",
    "BatchInput",
    "BatchRunner",
    "Loaded",
    "LocalBatchRunner",
    "runner_for",
]


def runner_for(backend: Any) -> BatchRunner:
    """The batch engine of ``backend`` (its ``batch_runner``).

    :raises BackendError: for a backend that cannot run batches.
    """
    runner: BatchRunner | None = getattr(backend, "batch_runner", None)
    if runner is None:
        raise BackendError(f"batches are not available on the {backend.name} backend yet")
    return runner


class BatchInput:
    """One input of a batch (``job``: its handle), answered over its batch's engine.

    The methods mirror a backend's single-job methods, without the job argument.
    """

    def __init__(self, runner: BatchRunner, job: JobRef) -> None:
        self.runner = runner
        self.job = job
        self.group_id = str(job.group_id)
        self.index = input_index(job)

    async def status(self) -> StatusReport:
        """The input's status: its outcome, else its batch's stop record, else the state
        a cleaned-up batch's summary keeps, else whether its engine is at work on it
        (NOT_FOUND when the batch has no records)."""
        loaded = await self.runner.load_many(self.group_id, [self.index])
        header = loaded[self.index][0] if self.index in loaded else None
        stop = None if header is not None else await self.runner.read_stop(self.group_id)
        settled = settled_input_report(header, stop)
        if settled is not None:
            return settled
        recorded = await self.runner.storage.exists(protocol.group_manifest_key(self.group_id))
        if recorded:  # a cleaned-up batch keeps its inputs' states, not their outcomes
            kept = summarized_input_report(await self._summary(), self.index)
            if kept is not None:
                return kept
        activity = await self.runner.input_activity(self.job) if recorded else InputActivity(False)
        return unsettled_input_report(
            recorded=recorded, running=activity.running, waiting=activity.waiting
        )

    async def _summary(self) -> Any:
        try:
            data = await self.runner.storage.read(protocol.group_summary_key(self.group_id))
        except ObjectNotFoundError:
            return None
        try:
            return protocol.load_summary(data)
        except ValueError:
            return None

    async def wait(self, on_change: StatusCallback | None = None) -> StatusReport:
        """Wait (driving the batch where its engine needs it) until the input is over.

        ``on_change`` is awaited with each new status, the first included. Cancelling
        the wait does not affect the input.
        """
        last = None
        while True:
            report = await self.status()
            if on_change is not None and report.status != last:
                await on_change(report)
            last = report.status
            if report.status.is_terminal:
                return report
            await self.runner.input_changed(self.job)

    async def logs(self, *, tail: int | None = None) -> str:
        """The input's output so far (the last ``tail`` lines when given)."""
        text = await self.runner.input_logs(self.job)
        if tail is not None:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-tail:]) if tail > 0 else ""
        return text

    async def follow_logs(self, finished: anyio.Event | None = None) -> AsyncIterator[str]:
        """The input's whole output, once the input is over.

        Batch inputs share workers (locally, and in a GKE pool) or store their output
        when their pod ends (GKE, one Job per input): there is no live stream of one
        input, so followers get it in one piece.
        """
        if finished is not None:
            await finished.wait()
        else:
            await self.wait()
        yield await self.logs()

    async def cancel(self) -> None:
        """End the input unless it has an outcome. Idempotent."""
        if await self.runner.load_many(self.group_id, [self.index]):
            return  # already over: its outcome stands
        await self.runner.cancel_input(self.job)

    async def read_result(self) -> bytes:
        """The input's result payload. :raises ObjectNotFoundError: when it has none."""
        loaded = await self.runner.load_many(self.group_id, [self.index])
        if self.index not in loaded:
            key = protocol.group_outcome_key(self.group_id, self.index)
            raise ObjectNotFoundError(key, self.runner.storage.url)
        return loaded[self.index][1]

    async def delete_objects(self) -> None:
        """Nothing: an input's objects go with its batch's cleanup."""
