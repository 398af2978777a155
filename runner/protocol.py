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
from typing import Any, Final, NotRequired, TypedDict

FORMAT: Final = 1

PHASES: Final = (
    "fetch",
    "verify",
    "unpack",
    "install",
    "deserialize",
    "resolve",
    "execute",
    "serialize",
    "upload",
)
"""Runner phases, in order. A failure names the phase it happened in."""

FUSE_ROOT: Final = "/kinetic-fuse"
"""Where GKE pods mount GCS buckets read-only with GCS FUSE (``{FUSE_ROOT}/{bucket}``)."""

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
    has_data: NotRequired[bool]
    """The payload holds data references (and maybe ``volumes``) to resolve first."""
    install: NotRequired[list[str]]
    """Requirement lines to install with ``uv pip install`` before the function is
    unpickled (prebuilt mode); a failure ends the job in phase ``install``."""


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


# --- Batches (``run_async_map``) ---------------------------------------------------
#
#   _groups/{group_id}/recording.json     written first: who is recording the batch
#   _groups/{group_id}/fn.pkl             the function, pickled once per batch
#   _groups/{group_id}/inputs/{c}.pkl     chunk c of the inputs: [(args, kwargs), ...]
#   _groups/{group_id}/manifest.json      written once, after every input: the commit point
#   _groups/{group_id}/results/*.log      appended outcomes, one record per input (see
#                                         runner/_results_log.py): JSON header + pickle
#   _groups/{group_id}/stop.json          the batch was cancelled or stopped (fail_fast)
#   _groups/{group_id}/summary.json       states kept after cleanup deleted the results
#   _groups/{group_id}/logs/worker-{n}.txt   worker output, with input markers
#
# On GKE (one Kubernetes Job per input, see kinetic/_backends/gke/batch.py) each
# input's pod writes two objects, and nothing else is written per input:
#
#   _groups/{group_id}/results/{index:07d}.res   the outcome: JSON header line + pickle
#   _groups/{group_id}/logs/{index}.txt           the input's output

DELIVERY = "at-least-once"
"""An input whose worker or supervisor died mid-run is run again when the batch resumes."""

INPUT_MARKER = "\x1ekinetic-input"
"""Starts the line a worker writes to its log before each input: ``MARKER index``."""


def group_prefix(group_id: str) -> str:
    return f"_groups/{group_id}/"


def group_manifest_key(group_id: str) -> str:
    return f"_groups/{group_id}/manifest.json"


def group_recording_key(group_id: str) -> str:
    return f"_groups/{group_id}/recording.json"


def group_payload_key(group_id: str) -> str:
    return f"_groups/{group_id}/fn.pkl"


def group_inputs_key(group_id: str, chunk: int) -> str:
    return f"_groups/{group_id}/inputs/{chunk:06d}.pkl"


def group_results_prefix(group_id: str) -> str:
    return f"_groups/{group_id}/results/"


def group_stop_key(group_id: str) -> str:
    return f"_groups/{group_id}/stop.json"


def group_summary_key(group_id: str) -> str:
    return f"_groups/{group_id}/summary.json"


def group_logs_prefix(group_id: str) -> str:
    return f"_groups/{group_id}/logs/"


def member_job_id(group_id: str, index: int) -> str:
    """The job id of input ``index`` of a batch: stable, and a valid job id."""
    return f"job-{group_id.removeprefix('grp-')}{index:08x}"


def member_attempt_id(group_id: str, index: int, attempt: int) -> str:
    """The id (Kubernetes ``job-id`` label) of one attempt of a batch input.

    Attempt 0 is the member's job id; a retry gets a suffix, so each attempt is a
    distinct Kubernetes Job whose creation is idempotent (same name on resume).
    """
    base = member_job_id(group_id, index)
    return base if attempt == 0 else f"{base}-a{attempt}"


def group_outcome_key(group_id: str, index: int) -> str:
    """The outcome object of one input of a batch run on GKE (written by its pod)."""
    return f"_groups/{group_id}/results/{index:07d}.res"


def group_member_logs_key(group_id: str, index: int) -> str:
    """The output of one input of a batch run on GKE (its last attempt's)."""
    return f"_groups/{group_id}/logs/{index}.txt"


def encode_outcome(header: dict[str, Any], payload: bytes) -> bytes:
    """One input's outcome object: a JSON header line (state, phase, error, attempt),
    then the pickled result payload. The header is readable without unpickling."""
    return dump_json(header) + b"\n" + payload


def decode_outcome(data: bytes) -> tuple[dict[str, Any], bytes]:
    """Split an outcome object into its header and payload.

    :raises ValueError: when ``data`` is not an outcome object.
    """
    head, sep, payload = data.partition(b"\n")
    header = load_json(head)
    if not sep or not isinstance(header, dict) or "state" not in header:
        raise ValueError("not a batch outcome object")
    return header, payload
