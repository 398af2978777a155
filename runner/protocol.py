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
    "debug",
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
    private_volumes: NotRequired[bool]
    """Place ``volumes`` in a private mount namespace (a local job shares the user's
    filesystem), not at the real paths (a pod's filesystem is its own)."""
    install: NotRequired[list[str]]
    """Requirement lines to install with ``uv pip install`` before the function is
    unpickled (prebuilt mode); a failure ends the job in phase ``install``."""
    debug: NotRequired[DebugSpec]
    """A ``debug=True`` job: wait for a debugger before running (``runner/debug.py``)."""


class DebugSpec(TypedDict):
    """How a debug job waits for its debugger."""

    wait: float
    """Seconds to wait for a client; none attached ends the job in phase ``debug``."""
    source_root: str
    """The project's path on the submitting machine: code shipped by value names its
    files there, and the runner points it at the job's copy (debuggers then find it)."""


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


def parse_member_job_id(job_id: str) -> tuple[str, int] | None:
    """``(group_id, index)`` of a batch input's job id (:func:`member_job_id`), or None
    for an id that cannot be one (a single job's ids are shorter)."""
    digits = job_id.removeprefix("job-")
    if len(digits) != 20 or not job_id.startswith("job-"):
        return None
    try:
        return f"grp-{digits[:12]}", int(digits[12:], 16)
    except ValueError:
        return None


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


# --- Batches run by a worker pool on GKE (one Kubernetes Job for the whole batch) ----
#
# The default on GKE (see runner/pool.py and kinetic/_backends/gke/pool.py). Besides the
# records above, per input: one claim object (created with a create-if-absent
# precondition) and the outcome object, and nothing else:
#
#   _groups/{group_id}/claims/{index:07d}.{n:03d}   claim n of input index (JSON)
#   _groups/{group_id}/results/{index:07d}.res      the outcome, as on the per-input path
#
# Claim 0 is the first run of an input. A claim whose lease expired (its worker died)
# is taken over by creating claim n + 1: of racing workers exactly one wins.

ENGINE_POOL: Final = "pool"
"""A batch run by one Kubernetes Job whose pods are a pool of workers (GKE default)."""
ENGINE_POD_PER_INPUT: Final = "pod_per_input"
"""A batch run as one Kubernetes Job (one pod) per input."""

POOL_LEASE_SECONDS: Final = 30.0
"""How long a claim holds without renewal. A worker renews it every third of that while
the input runs; a claim not renewed in time belongs to a dead worker and is taken over.
Leases compare wall clocks of different machines: keep this far above their skew."""

POOL_MAX_CLAIMS_EXTRA: Final = 2
"""Claims of one input beyond ``retries + 1`` before it is failed instead of run again:
an input whose run keeps killing its worker (out of memory, say) must not loop."""


class ClaimRecord(TypedDict):
    """The content of a claim object: who runs the input, until when it holds."""

    worker: str
    expires: float
    """Wall-clock time (seconds since the epoch) after which the claim is void."""


def batch_engine(manifest: dict[str, Any]) -> str:
    """The engine that runs a recorded GKE batch (batches recorded before pools existed
    ran one Job per input)."""
    gke = manifest.get("gke") or {}
    return str(gke.get("engine") or ENGINE_POD_PER_INPUT)


def group_claims_prefix(group_id: str) -> str:
    return f"_groups/{group_id}/claims/"


def group_claim_key(group_id: str, index: int, number: int) -> str:
    """Claim ``number`` (0 first) of input ``index`` of a pool batch."""
    return f"_groups/{group_id}/claims/{index:07d}.{number:03d}"


def parse_claim_name(name: str) -> tuple[int, int] | None:
    """``(index, number)`` of a claim object's name relative to the claims prefix."""
    head, dot, tail = name.partition(".")
    if not dot or not head.isdigit() or not tail.isdigit():
        return None
    return int(head), int(tail)


def parse_outcome_name(name: str) -> int | None:
    """The input index of an outcome object's name relative to the results prefix."""
    if name.endswith(".res") and name[:-4].isdigit():
        return int(name[:-4])
    return None


# --- Multi-host jobs (the ``pathways`` backend: one LeaderWorkerSet, one pod per host) --
#
# Every host runs the same runner on the same job; each writes its own outcome, under
#
#   {job_id}/hosts/{host}/started      created once, when the host's runner first starts
#   {job_id}/hosts/{host}/result.pkl   the host's result payload
#   {job_id}/hosts/{host}/status.json  the host's final record (after result.pkl)
#   {job_id}/hosts/{host}/logs.txt     the host's output
#
# The submitting side composes the job's outcome: host 0's value when every host
# succeeded, else the failing host's exception (kinetic/_core/lws_status.py).

HOST_ENV: Final = "TPU_WORKER_ID"
"""The variable naming the host (0 = the leader) of a multi-host job's pod."""


def host_index(environ: Any) -> int | None:
    """The host index of a multi-host job's runner (``TPU_WORKER_ID`` in the mapping
    ``environ``), or None.

    :raises ValueError: when the variable is set but not a non-negative integer.
    """
    raw = environ.get(HOST_ENV)
    if raw is None or raw == "":
        return None
    value = int(raw)
    if value < 0:
        raise ValueError(f"{HOST_ENV} must be a non-negative integer, got {raw!r}")
    return value


def hosts_prefix(job_id: str) -> str:
    return f"{job_id}/hosts/"


def host_started_key(job_id: str, host: int) -> str:
    return f"{job_id}/hosts/{host}/started"


def host_result_key(job_id: str, host: int) -> str:
    return f"{job_id}/hosts/{host}/result.pkl"


def host_final_key(job_id: str, host: int) -> str:
    return f"{job_id}/hosts/{host}/status.json"


def host_logs_key(job_id: str, host: int) -> str:
    return f"{job_id}/hosts/{host}/logs.txt"


def parse_host_key(job_id: str, key: str) -> tuple[int, str] | None:
    """``(host, name)`` of an object key under :func:`hosts_prefix`, else None."""
    rest = key.removeprefix(hosts_prefix(job_id))
    head, sep, name = rest.partition("/")
    if rest == key or not sep or not head.isdigit():
        return None
    return int(head), name
