"""Job status values and the pure rules that derive them from a job's records.

Besides single jobs, the rules for the inputs of a batch, the same on every backend:
an input's outcome settles it (:func:`input_report`); without one, its batch's stop
record does (:func:`stopped_report`: it never ran); else it is pending or running, as
the backend sees it (:func:`unsettled_input_report`). And one rule for a job that
cannot start (:func:`start_grace_left`, :func:`start_failure`): it fails after a grace
time, with one wording everywhere.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from runner import protocol

START_PHASE: Final = "start"
"""The phase of a job that failed because it could not start (``start_grace``)."""


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
    :ivar attempt: a job that retries (``run(retries=)``): the attempt running now, or
        the one that settled it (1 for the first); None for a job that does not retry.
    :ivar attempts: a job that retries: its earlier, failed attempts, in order.
    :ivar preempted: its pod was lost mid-run (preempted, evicted): FAILED, when no retry
        was left (phase ``preempted``); PENDING or RUNNING, while a replacement pod takes
        the next attempt.
    """

    status: JobStatus
    reason: str | None = None
    phase: str | None = None
    cancelled: bool = False
    attempt: int | None = None
    attempts: tuple[Attempt, ...] = ()
    preempted: bool = False


@dataclass(frozen=True)
class Attempt:
    """One failed attempt of a job that retries.

    :ivar number: 1 for the first.
    :ivar started, ended: Unix times.
    :ivar phase, error, error_type: how it failed (``error_type``: the exception's
        qualified name).
    """

    number: int
    started: float
    ended: float
    phase: str
    error: str
    error_type: str


def attempts_from_records(records: Any) -> tuple[Attempt, ...]:
    """The failed attempts a runner recorded (``attempts.json``, or its final record's
    ``attempts``); malformed entries are left out. Pure."""
    if not isinstance(records, list):
        return ()
    out = []
    for rec in records:
        try:
            out.append(
                Attempt(
                    number=int(rec["attempt"]),
                    started=float(rec["started"]),
                    ended=float(rec["ended"]),
                    phase=str(rec["phase"]),
                    error=str(rec["error"]),
                    error_type=str(rec["error_type"]),
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return tuple(out)


def status_from_records(*, final: Mapping[str, Any] | None, cancelled: bool) -> StatusReport | None:
    """The status the job's own records settle, whatever runs it: the runner's final
    record wins, then a cancel record; None when neither exists."""
    if final is not None:
        ok = final.get("state") == "succeeded"
        attempt = final.get("attempt")
        return StatusReport(
            JobStatus.SUCCEEDED if ok else JobStatus.FAILED,
            reason=None if ok else str(final.get("error") or "job failed"),
            phase=None if ok else final.get("phase"),
            attempt=attempt if isinstance(attempt, int) else None,
            attempts=attempts_from_records(final.get("attempts")),
            preempted=not ok and final.get("phase") == protocol.PREEMPTED_PHASE,
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


# --- batch inputs -------------------------------------------------------------------

NO_BATCH_REASON: Final = "no records for this batch"
GPU_WAIT_REASON: Final = "waiting for GPUs: other jobs hold all of them"


def input_report(header: protocol.OutcomeHeader) -> StatusReport:
    """The status a batch input's outcome header stands for; ``attempt`` (1 for the
    first) only for an input that was retried: its header counts retries (0 first)."""
    state = header.get("state")
    retried = header.get("attempt")
    attempt = retried + 1 if isinstance(retried, int) and retried > 0 else None
    if state == "succeeded":
        return StatusReport(JobStatus.SUCCEEDED, attempt=attempt)
    if state == "cancelled":
        return StatusReport(JobStatus.FAILED, reason="cancelled", cancelled=True)
    phase = header.get("phase")
    return StatusReport(
        JobStatus.FAILED,
        reason=str(header.get("error") or "failed"),
        phase=phase,
        attempt=attempt,
        preempted=phase == protocol.PREEMPTED_PHASE,
    )


def stopped_report(stop: protocol.StopRecord) -> StatusReport:
    """The status of an input that never ran because its batch stopped: failed with the
    batch's failure when the batch could not run (reason ``failed``), else cancelled."""
    if stop.get("reason") == "failed":  # the function itself could not be set up
        return StatusReport(
            JobStatus.FAILED, reason=str(stop.get("detail")), phase=stop.get("phase")
        )
    return StatusReport(
        JobStatus.FAILED,
        reason=f"not run: the batch stopped ({stop.get('reason')}: {stop.get('detail')})",
        cancelled=True,
    )


def settled_input_report(
    header: protocol.OutcomeHeader | None, stop: protocol.StopRecord | None
) -> StatusReport | None:
    """The status a batch input's records settle: its outcome (``header``) wins, then its
    batch's stop record (an input without an outcome in a stopped batch never runs);
    None when neither exists. A backend reads ``stop`` only when ``header`` is None."""
    if header is not None:
        return input_report(header)
    if stop is not None:
        return stopped_report(stop)
    return None


CLEANED_REASON: Final = (
    "failed (the batch was cleaned up: its summary keeps the state, not the error)"
)


def summarized_input_report(summary: Mapping[str, Any] | None, index: int) -> StatusReport | None:
    """The status a cleaned-up batch's summary (``summary.json``) keeps of input ``index``,
    whose outcome the cleanup deleted; None without a summary or a state for it."""
    if not isinstance(summary, Mapping):
        return None
    states = summary.get("states")
    state = states.get(str(index)) if isinstance(states, Mapping) else None
    if state is None:
        state = summary.get("others")
    if state is None:
        return None
    kept = protocol.as_input_state(state)
    if kept == "succeeded":
        return StatusReport(JobStatus.SUCCEEDED)
    if kept == "cancelled":
        return StatusReport(JobStatus.FAILED, reason="cancelled", cancelled=True)
    return StatusReport(JobStatus.FAILED, reason=CLEANED_REASON)


def unsettled_input_report(
    *, recorded: bool, running: bool, waiting: str | None = None
) -> StatusReport:
    """The status of a batch input its records do not settle (:func:`settled_input_report`).

    :param recorded: the batch's manifest exists (else the input is NOT_FOUND).
    :param running: the backend sees the input, or its batch's engine, at work.
    :param waiting: why a running batch cannot start the input yet (it is then PENDING
        with that reason), or None.
    """
    if not recorded:
        return StatusReport(JobStatus.NOT_FOUND, reason=NO_BATCH_REASON)
    if running and waiting is not None:
        return StatusReport(JobStatus.PENDING, reason=waiting)
    return StatusReport(JobStatus.RUNNING if running else JobStatus.PENDING)


# --- jobs that cannot start -----------------------------------------------------------


def start_grace_left(*, stuck_since: float, now: float, grace: float) -> float:
    """Seconds a job unable to start since ``stuck_since`` may still wait (monotonic
    times); at 0 or less it has waited its ``grace`` out and fails (:func:`start_failure`)."""
    return grace - (now - stuck_since)


def could_not_start(why: object, grace: float, *, subject: str = "the job") -> str:
    """The reason given when ``subject`` could not start within ``grace`` seconds (``why``:
    what kept it, as the cluster reports it)."""
    return f"{subject} could not start within {grace:g}s: {why}"


def start_failure(why: object, grace: float) -> StatusReport:
    """The status of a job (or batch input) that could not start within ``grace``
    seconds: FAILED in phase :data:`START_PHASE`."""
    return StatusReport(JobStatus.FAILED, reason=could_not_start(why, grace), phase=START_PHASE)
