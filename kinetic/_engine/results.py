"""Turn a job's result payload into a value or the right exception."""

from __future__ import annotations

import pickle
from typing import Any

import cloudpickle

from kinetic._exceptions import JobFailedError, JobPreemptedError, RemoteError, ResultError
from runner import protocol

_NOT_REBUILT = (
    "builtins.SystemExit",
    "builtins.KeyboardInterrupt",
    "builtins.GeneratorExit",
    protocol.TIME_LIMIT_ERROR_TYPE,  # the job's run-time limit: a failure of its own
)


def load_payload(data: bytes, job_id: str) -> dict[str, Any]:
    """Unpickle a result payload. Blocking (may be large): call in a worker thread.

    :raises ResultError: when the bytes are not a result payload (or not the bytes
        the job stored: a sealed payload is checked against its SHA-256), or it refers
        to code that cannot be imported here.
    """
    try:
        data = protocol.unseal(data)
    except ValueError as exc:
        raise ResultError(
            f"the result payload of job {job_id} is corrupted: {exc}", job_id=job_id
        ) from exc
    try:
        payload = cloudpickle.loads(data)
    except (ModuleNotFoundError, AttributeError, ImportError) as exc:
        raise ResultError(
            f"the result of job {job_id} needs code that is not importable here: {exc}",
            job_id=job_id,
        ) from exc
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError) as exc:
        raise ResultError(
            f"the result payload of job {job_id} is corrupted: {exc}", job_id=job_id
        ) from exc
    except Exception as exc:
        raise ResultError(
            f"the result payload of job {job_id} cannot be loaded: {type(exc).__name__}: {exc}",
            job_id=job_id,
        ) from exc
    if not isinstance(payload, dict) or "success" not in payload:
        raise ResultError(f"the result payload of job {job_id} is corrupted", job_id=job_id)
    return payload


def unwrap(payload: dict[str, Any], job_id: str) -> Any:
    """Return the value, or raise what the job ended with.

    The user's own exception is re-raised as its original type with the remote
    traceback as a note. ``SystemExit`` and runner failures raise
    :class:`JobFailedError` naming the phase (a run-time limit, too: ``execute``, and the
    limit); a user exception that could not be
    carried over raises :class:`RemoteError`.
    """
    if payload["success"]:
        return payload["result"]
    phase = payload.get("phase")
    error = payload.get("error") or "unknown error"
    error_type = payload.get("error_type") or ""
    tb = payload.get("traceback")
    exc = payload.get("exception")
    if isinstance(exc, BaseException):
        if tb:
            exc.add_note(f"Remote traceback (job {job_id}):\n{tb}")
        raise exc
    if phase == "execute" and error_type and error_type not in _NOT_REBUILT:
        err: Exception = RemoteError(
            f"job {job_id} raised {error} (the exception could not be rebuilt locally)",
            remote_type=error_type,
            job_id=job_id,
        )
    else:
        kind = JobPreemptedError if phase == protocol.PREEMPTED_PHASE else JobFailedError
        err = kind(f"job {job_id} failed in phase {phase!r}: {error}", job_id=job_id, phase=phase)
    if tb and phase != protocol.PREEMPTED_PHASE:  # the runner's frames would say nothing
        err.add_note(f"Remote traceback (job {job_id}):\n{tb}")
    raise err
