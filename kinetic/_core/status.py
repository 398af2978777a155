"""Job status values and the pure rules that derive them from a job's records."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class JobStatus(enum.Enum):
    """Observable status of a job."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    NOT_FOUND = "NOT_FOUND"

    @property
    def is_terminal(self) -> bool:
        """Whether the job can no longer change state."""
        return self in _TERMINAL


_TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.NOT_FOUND})


@dataclass(frozen=True)
class StatusReport:
    """A status plus the facts behind it.

    :ivar reason: why the job is FAILED (or why it is stuck PENDING), for humans.
    :ivar phase: the runner phase that failed, when known.
    :ivar cancelled: the job was ended by ``cancel()``.
    """

    status: JobStatus
    reason: str | None = None
    phase: str | None = None
    cancelled: bool = False


def status_from_records(*, final: Mapping[str, Any] | None, cancelled: bool) -> StatusReport | None:
    """The status the job's own records settle, whatever runs it: the runner's final
    record wins, then a cancel record; None when neither exists."""
    if final is not None:
        ok = final.get("state") == "succeeded"
        return StatusReport(
            JobStatus.SUCCEEDED if ok else JobStatus.FAILED,
            reason=None if ok else str(final.get("error") or "job failed"),
            phase=None if ok else final.get("phase"),
        )
    if cancelled:
        return StatusReport(JobStatus.FAILED, reason="cancelled", cancelled=True)
    return None


def status_from_local_records(
    *,
    final: Mapping[str, Any] | None,
    cancelled: bool,
    launched: bool,
    alive: bool,
    exit_code: int | None,
) -> StatusReport:
    """Derive a local job's status from its records and its process liveness.

    :param final: the runner's final record (``status.json``), if written.
    :param cancelled: a cancel record exists.
    :param launched: the launcher recorded a process for the job.
    :param alive: that process is still running.
    :param exit_code: the exit status the job's wrapper recorded, if any
        (``128 + N`` when the runner was killed by signal ``N``).
    """
    settled = status_from_records(final=final, cancelled=cancelled)
    if settled is not None:
        return settled
    if not launched:
        return StatusReport(JobStatus.PENDING)
    if alive:
        return StatusReport(JobStatus.RUNNING)
    return StatusReport(JobStatus.FAILED, reason=describe_exit(exit_code))


def describe_exit(exit_code: int | None) -> str:
    """Explain how a runner process ended without writing its final record."""
    if exit_code is None:
        return "the runner process vanished without writing a result"
    if exit_code > 128:
        return f"the runner process was killed by signal {exit_code - 128} before writing a result"
    return f"the runner process exited with status {exit_code} without writing a result"
