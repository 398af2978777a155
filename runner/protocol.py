"""The wire format between a submitting process and the runner.

Both sides import this module (the runner never imports ``kinetic``), so it
uses the standard library only. It defines where a job's objects live in
storage, what the job spec says, and what the result payload and the final
record hold.

Object layout (keys relative to the bucket or local storage root)::

    {job_id}/handle.json     the JobHandle, written at submission
    {job_id}/spec.json       what the runner needs: digests, paths, env
    {job_id}/payload.pkl     cloudpickle of {"fn", "args", "kwargs"}
    {job_id}/result.pkl      cloudpickle of the result payload (runner)
    {job_id}/status.json     the final record, written after result.pkl (runner)
    {job_id}/logs.txt        the job's output
    default/contexts/{sha256}.zip   content-addressed context archives
"""

from __future__ import annotations

import json
from typing import Any, Final, TypedDict

FORMAT: Final = 1

PHASES: Final = (
    "fetch",
    "verify",
    "unpack",
    "deserialize",
    "resolve",
    "execute",
    "serialize",
    "upload",
)
"""Runner phases, in order. A failure names the phase it happened in."""

EXIT_OK: Final = 0
EXIT_USER_ERROR: Final = 1
EXIT_RUNNER_ERROR: Final = 2


def handle_key(job_id: str) -> str:
    return f"{job_id}/handle.json"


def spec_key(job_id: str) -> str:
    return f"{job_id}/spec.json"


def payload_key(job_id: str) -> str:
    return f"{job_id}/payload.pkl"


def result_key(job_id: str) -> str:
    return f"{job_id}/result.pkl"


def final_key(job_id: str) -> str:
    return f"{job_id}/status.json"


def logs_key(job_id: str) -> str:
    return f"{job_id}/logs.txt"


def context_key(sha256: str) -> str:
    return f"default/contexts/{sha256}.zip"


class JobSpec(TypedDict):
    """What the runner needs besides the payload. JSON, written before launch."""

    format: int
    job_id: str
    func_name: str
    payload_sha256: str
    context_key: str | None
    context_sha256: str | None
    cwd: str | None
    """Working directory relative to the unpacked context, or None for its root."""
    sys_path: list[str]
    """Entries relative to the unpacked context, prepended to sys.path in order."""
    env: dict[str, str]
    output_dir: str


class FinalRecord(TypedDict):
    """The runner's last word on a job: small JSON, readable without unpickling."""

    state: str  # "succeeded" | "failed"
    phase: str | None
    error: str | None
    error_type: str | None


def dump_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def load_json(data: bytes) -> Any:
    return json.loads(data.decode())


def result_payload(
    *,
    success: bool,
    result: Any = None,
    exception: BaseException | None = None,
    traceback: str | None = None,
    phase: str | None = None,
    error: str | None = None,
    error_type: str | None = None,
) -> dict[str, Any]:
    """Build the result payload dict the runner pickles into ``result.pkl``.

    ``exception`` is the user's exception when it can be pickled; ``error`` and
    ``error_type`` always describe the failure in plain text so the client can
    report it even when the exception object cannot be rebuilt.
    """
    return {
        "format": FORMAT,
        "success": success,
        "result": result,
        "exception": exception,
        "traceback": traceback,
        "phase": phase,
        "error": error,
        "error_type": error_type,
    }
