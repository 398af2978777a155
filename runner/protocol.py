"""The wire format between a submitting process and the runner.

Both sides import this module (the runner never imports ``kinetic``), so it
uses the standard library only. It defines where a job's objects live in
storage, what the job spec says, and what the result payload and the final
record hold; and for batches, the typed records (manifest, map options, outcome
header, stop record, summary) whose keys are named here and nowhere else.

Object layout (keys relative to the bucket or local storage root)::

    {job_id}/handle.json     the JobHandle, written at submission
    {job_id}/spec.json       what the runner needs: digests, paths, env
    {job_id}/payload.pkl     cloudpickle of {"fn", "args", "kwargs"}
    {job_id}/result.pkl      the result payload: cloudpickle, sealed (see seal())
    {job_id}/status.json     the final record, written after result.pkl (runner)
    {job_id}/logs.txt        the job's output
    default/contexts/{sha256}.zip   content-addressed context archives
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from typing import Any, Final, Literal, NotRequired, TypedDict, cast

FORMAT: Final = 1

PHASES: Final = (
    "fetch",
    "verify",
    "unpack",
    "install",
    "secrets",
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


class PhaseError(Exception):
    """A runner step failed outside the user's code, in ``phase`` (one of :data:`PHASES`)."""

    def __init__(self, phase: str, message: str) -> None:
        super().__init__(message)
        self.phase = phase


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
    install_kept: NotRequired[list[str]]
    """Lines marked ``# kn:keep``, installed as written by a uv run of their own after
    ``install`` (the user's override of the image's runtime); phase ``install`` too."""
    debug: NotRequired[DebugSpec]
    """A ``debug=True`` job: wait for a debugger before running (``runner/debug.py``)."""
    python: NotRequired[str]
    """The submitting interpreter's ``X.Y``: the payload's code was pickled there, and
    loads in that minor version only (:func:`check_spec`)."""
    secrets: NotRequired[list[SecretRecord]]
    """Secrets the runner resolves itself, on this machine (a local job: ``runner/secrets.py``):
    references only, never values; an unresolvable one ends the job in phase ``secrets``.
    A pod's secrets come from Kubernetes instead (the Job's manifest, a batch's ``gke``)."""
    timeout: NotRequired[float]
    """The run-time limit of phase ``execute``, in seconds (``kinetic.run(timeout=)``):
    the runner ends the job when its function runs longer (:mod:`runner.time_limit`)."""
    retries: NotRequired[RetriesRecord]
    """Run the function again after a matching exception (``kinetic.run(retries=)``,
    :mod:`kinetic._core.retries`); each attempt is recorded (:func:`attempts_key`)."""


class RetriesRecord(TypedDict):
    """A job's retries, as its spec records them."""

    count: int
    """Extra attempts after the first."""
    backoff: float
    initial_delay: float
    """Seconds before the first retry; each later delay is the previous times ``backoff``."""
    on: list[str]
    """Qualified names of the exception types retried (their subclasses too)."""


class AttemptRecord(TypedDict):
    """One failed attempt of a job that retries (the final record holds the earlier ones)."""

    attempt: int
    """1 for the first run."""
    started: float
    """Unix times: for display (the delays between attempts are the runner's)."""
    ended: float
    phase: str
    error: str
    error_type: str


def exception_type_names(kind: type[BaseException]) -> frozenset[str]:
    """The qualified names (``module.QualName``) of ``kind`` and its bases: what a
    ``kinetic.Retries``' ``on`` is matched against (:mod:`runner.retry_rule`)."""
    return frozenset(f"{base.__module__}.{base.__qualname__}" for base in kind.__mro__)


def attempts_key(job_id: str) -> str:
    """The failed attempts of a job that retries, rewritten by its runner after each."""
    return f"{job_id}/attempts.json"


PREEMPTED_PHASE: Final = "preempted"
"""The phase of an attempt, or of a job, ended by the loss of its pod (preempted, evicted,
its node gone) while the function ran: no exception of the function, so any ``retries=``
retries it whatever its ``on`` (:mod:`runner.preemption`)."""
PREEMPTED_ERROR_TYPE: Final = "runner.preemption.Preempted"
"""The ``error_type`` recorded for such an attempt, and for a job that ends with it."""


class RunningRecord(TypedDict):
    """The attempt a job's pod is running (``running.json``, :func:`running_key`): what a
    replacement pod reads to learn that the pod before it was lost mid-attempt."""

    pod: str
    attempt: int
    started: float


POD_ENV: Final = "KINETIC_POD_NAME"
"""A GKE job's pod's name, given to its container by the Job's manifest (the downward
API): the runner records it with each attempt (:func:`running_key`)."""


def running_key(job_id: str) -> str:
    """The attempt a job's pod runs now, written as each attempt starts (GKE jobs only)."""
    return f"{job_id}/running.json"


class SecretRecord(TypedDict):
    """A reference to a secret, as a spec or a batch manifest records it: never a value.

    No ``keys`` and no ``mount``: every key as an environment variable. ``keys``: the
    named keys, each as the variable it maps to. ``mount``: every key as a read-only
    file in that directory."""

    name: str
    keys: NotRequired[dict[str, str]]
    mount: NotRequired[str]


def python_version() -> str:
    """This interpreter's ``X.Y``: what a payload pickled here needs where it loads."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


PYTHON_ENV = "KINETIC_PYTHON"
"""The submitting Python's ``X.Y``, in the environment of a runner delivered into a
custom image: checked before the store is opened (Kinetic's dependencies delivered
with it are that Python's, and may not import in another)."""

TERMINATION_LOG = "/dev/termination-log"
"""Where a pod's container leaves its last words (Kubernetes' default path): a runner
that cannot record its failure in the store says it there, as
:func:`unrecorded_failure` formats it."""
_UNRECORDED = re.compile(r"^kinetic runner failed in phase ([a-z]+): (.+)", re.DOTALL)


def unrecorded_failure(phase: str, message: str) -> str:
    """The termination message of a failure the store could not be told of."""
    return f"kinetic runner failed in phase {phase}: {message}"


def parse_unrecorded_failure(text: str) -> tuple[str, str] | None:
    """(phase, message) of :func:`unrecorded_failure`'s text, else None."""
    match = _UNRECORDED.match(text.strip())
    return (match.group(1), match.group(2)) if match else None


def wrong_python(wanted: str, here: str) -> str:
    """Why a payload of Python ``wanted`` is refused by a runner of Python ``here``."""
    return (
        f"the job was submitted from Python {wanted}, and this runner is Python {here} "
        f"({sys.executable}): code pickled by one Python minor version does not load "
        f"in another. Run it in an image with Python {wanted} (Kinetic's bundled and "
        f"prebuilt images follow the submitting Python; a custom image must too), or "
        f"submit from Python {here}"
    )


def check_spec(spec: Any) -> JobSpec:
    """``spec`` (a job's, or a batch manifest's) if this runner can honour it.

    A spec names only what its writer's runner knows. A key this runner does not know
    comes from a newer Kinetic than the image's (a prebuilt base of an earlier build):
    ignoring it would run the job without what it asked for, so the job fails instead.

    A payload pickled by another Python minor version is refused too, before anything
    of it is unpickled: cloudpickle carries code objects, whose format changes between
    minor versions (3.12's code loaded by 3.11 crashed the interpreter).

    :raises PhaseError: (phase ``fetch``) not a JSON object, keys this runner lacks, or
        a payload of another Python.
    """
    if not isinstance(spec, dict):
        raise PhaseError("fetch", "the job's spec is not a JSON object")
    wanted, here = spec.get("python"), python_version()
    if isinstance(wanted, str) and wanted != here:
        raise PhaseError("fetch", wrong_python(wanted, here))
    unknown = sorted(set(spec) - JobSpec.__required_keys__ - JobSpec.__optional_keys__)
    if unknown:
        raise PhaseError(
            "fetch",
            f"the job asks for {', '.join(unknown)}, which this image's runner does not "
            "know: the image holds an older Kinetic than the one that submitted the job "
            "(rebuild it: `kinetic build-image --rebuild` for a prebuilt base)",
        )
    return cast("JobSpec", spec)


class DebugSpec(TypedDict):
    """How a debug job waits for its debugger."""

    wait: float
    """Seconds to wait for a client; none attached ends the job in phase ``debug``."""
    source_root: str
    """The project's path on the submitting machine: code shipped by value names its
    files there, and the runner points it at the job's copy (debuggers then find it)."""
    shared_port: NotRequired[bool]
    """A local job whose kernel refuses it a private network may listen on the
    machine's loopback (``KINETIC_DEBUG_SHARED_PORT``), where any local user can attach;
    without it, such a job fails in phase ``debug``."""


TIME_LIMIT_ERROR_TYPE: Final = "runner.time_limit.TimeLimitExceeded"
"""The ``error_type`` of a job that ran past its run-time limit: a failure of its own
(``JobFailedError`` in phase ``execute``), never a user exception to rebuild."""


def time_limit_message(seconds: float) -> str:
    """Why a job that ran past its run-time limit failed (the runner's record, and a
    Kubernetes Job past its deadline)."""
    return f"the job ran past its time limit of {seconds:g} s (timeout={seconds:g})"


class FinalRecord(TypedDict):
    """The runner's last word on a job: small JSON, readable without unpickling."""

    state: Literal["succeeded", "failed"]
    phase: str | None
    error: str | None
    error_type: str | None
    attempt: NotRequired[int]
    """A job that retries: the attempt that settled it (1 for the first)."""
    attempts: NotRequired[list[AttemptRecord]]
    """A job that retries: its earlier, failed attempts, in order."""


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


SEAL: Final = b"KNRS1\n"
"""The start of a sealed result payload: then its SHA-256 (32 bytes), then the pickle."""


def seal(payload: bytes) -> bytes:
    """A pickled result payload framed with its SHA-256, as stored in ``result.pkl``: a
    reader then tells any change of the bytes (a flipped bit, a truncation) from the value
    (unpickling alone may well succeed, with another value)."""
    return b"".join((SEAL, hashlib.sha256(payload).digest(), payload))


def unseal(data: bytes) -> bytes:
    """The pickle inside a sealed payload; an unsealed pickle (older runners) unchanged.

    :raises ValueError: the bytes are neither, or do not match their digest.
    """
    if data.startswith(SEAL):
        digest, payload = data[len(SEAL) : len(SEAL) + 32], data[len(SEAL) + 32 :]
        if hashlib.sha256(payload).digest() != digest:
            raise ValueError("its bytes do not match their SHA-256 (changed in storage)")
        return payload
    if not data.startswith(b"\x80"):  # every pickle of protocol 2 or later starts so
        raise ValueError("it is neither a sealed nor a pickled result payload")
    return data


# --- Batches (``run_async_map``) ---------------------------------------------------
#
#   _groups/{group_id}/recording.json     written first: who is recording the batch
#   _groups/{group_id}/fn.pkl             the function, pickled once per batch
#   _groups/{group_id}/inputs/{c}.pkl     chunk c of the inputs: [(args, kwargs), ...]
#   _groups/{group_id}/manifest.json      written once, after every input: the commit point
#   _groups/{group_id}/results/*.log      appended outcomes, one record per input (see
#                                         runner/results_log.py): JSON header + pickle
#   _groups/{group_id}/stop.json          the batch was cancelled or stopped (fail_fast)
#   _groups/{group_id}/summary.json       states kept after cleanup deleted the results
#   _groups/{group_id}/logs/worker-{n}.txt   worker output, with input markers
#
# On GKE (one Kubernetes Job per input, see kinetic/_backends/gke/batch.py) each
# input's pod writes two objects, and nothing else is written per input:
#
#   _groups/{group_id}/results/{index:07d}.res   the outcome: JSON header line + pickle
#   _groups/{group_id}/logs/{index}.txt           the input's output

# The records of a batch. Every key of these JSON objects is named here, once: readers
# and writers in both packages go through these types (mypy checks each key).

InputMode = Literal["auto", "single", "args", "kwargs"]
"""How each input becomes a call (see ``kinetic._core.inputs.to_call``)."""
INPUT_MODES: Final[tuple[InputMode, ...]] = ("auto", "single", "args", "kwargs")

InputState = Literal["succeeded", "failed", "cancelled"]
"""The final state of one input of a batch."""
INPUT_STATES: Final[tuple[InputState, ...]] = ("succeeded", "failed", "cancelled")

StopReason = Literal["cancelled", "fail_fast", "failed"]
"""Why a batch stopped: ``cancel()``; a final failure with ``fail_fast``; the batch
could not run at all (its function, context or workers), each input failing with it."""

BatchEngine = Literal["pool", "coordinated", "pod_per_input"]
"""What runs a GKE batch (:data:`ENGINE_POOL`, :data:`ENGINE_POD_PER_INPUT`)."""


class MapOptionsRecord(TypedDict):
    """The manifest's ``options``: how the batch runs (``run_async_map``'s arguments)."""

    input_mode: InputMode
    max_concurrent: int
    """Inputs running at once: the caller's value, or the backend's default."""
    retries: int
    """Extra attempts of a failed input (the count; every reader takes it)."""
    fail_fast: bool
    cancel_running_on_fail: bool
    retry_rule: NotRequired[RetriesRecord]
    """A ``kinetic.Retries``: its delays and exception types, applied by the runner
    (:mod:`runner.retry_rule`). Absent: the plain count, every failure retried at once."""


class BatchHandleRecord(TypedDict):
    """The manifest's ``handle``: the fields every input's ``JobHandle`` shares."""

    backend: str
    project: str
    bucket_name: str
    cluster_name: str
    zone: str
    namespace: str
    image_uri: str
    accelerator: str
    func_name: str
    created_at: str
    debug: bool


class GKEBatchRecord(TypedDict):
    """The manifest's ``gke``: what the pods of a GKE batch run with."""

    image: str
    namespace: str
    accelerator: str
    """The accelerator's name, with ``:spot`` when it runs on spot nodes."""
    fuse_buckets: list[str]
    """Buckets mounted read-only (GCS FUSE) in every pod."""
    engine: NotRequired[BatchEngine]
    """Absent in batches recorded before pools existed: one Job per input."""
    lease_s: NotRequired[float]
    max_claims: NotRequired[int]
    reuse_process: NotRequired[bool]
    """Pool workers run inputs in their own process, not a fork each (the user's opt-in)."""
    runner_image: NotRequired[str]
    """A custom image's batch: the image Kinetic's runner is delivered from."""
    secrets: NotRequired[list[SecretRecord]]
    """The Kubernetes Secrets every pod reads (references: names, keys, mount paths)."""


class BatchManifest(TypedDict):
    """``manifest.json``: the commit point of a batch, written once, never rewritten."""

    format: int
    group_id: str
    group_kind: Literal["map"]
    name: str | None
    tags: dict[str, str]
    func_name: str
    total: int
    chunk_size: int
    n_chunks: int
    delivery: str
    created_at: str
    options: MapOptionsRecord
    spec: JobSpec
    """The spec every input runs with (its ``job_id`` is the group id)."""
    handle: BatchHandleRecord
    gke: NotRequired[GKEBatchRecord]


class RecordingRecord(TypedDict):
    """``recording.json``: who records the batch (written before anything else)."""

    pid: int
    host: str
    started_at: str


class OutcomeHeader(TypedDict):
    """The JSON header of one input's outcome (a results log record, or a ``.res``
    object): readable without unpickling the payload after it. Absent keys are None."""

    state: InputState
    attempt: NotRequired[int]
    phase: NotRequired[str]
    error: NotRequired[str]
    error_type: NotRequired[str]
    claim: NotRequired[int]
    """Pool batches: the number of the claim the input ran under."""
    worker: NotRequired[str]
    """Pool batches: the worker that ran it."""
    output: NotRequired[str]
    """Pool batches: the tail of the input's output."""
    sha256: NotRequired[str]
    """GKE outcome objects: the SHA-256 of the payload after the header (checked when
    read: a changed payload is an error, never another value)."""


class StopRecord(TypedDict):
    """``stop.json``: the batch stopped; no input without an outcome starts any more."""

    reason: StopReason
    detail: str
    phase: str | None
    """With reason ``failed``: the phase every input fails in."""


class BatchSummary(TypedDict):
    """``summary.json``: the inputs' states, kept after cleanup deleted the results.

    ``states`` maps input indices (decimal strings) to states; ``others``, when
    present, is the state of every input not in ``states``.
    """

    states: dict[str, InputState]
    others: NotRequired[InputState]


def as_input_state(value: object) -> InputState:
    """``value`` if it is an input's final state; any other value counts as ``failed``."""
    for state in INPUT_STATES:
        if value == state:
            return state
    return "failed"


def outcome_header(attempt: int, record: FinalRecord, **extra: str | int | None) -> OutcomeHeader:
    """The header of an input's outcome from the runner's final record: the attempt,
    the record's keys that are set, then ``extra`` (pool batches: ``claim``, ``worker``)."""
    header: dict[str, Any] = {"attempt": attempt, **extra}
    header.update({k: v for k, v in record.items() if v is not None})
    return cast(OutcomeHeader, header)


def cancelled_header() -> OutcomeHeader:
    """The header of an input cancelled on its own (not by the batch's stop)."""
    return ended_header("cancelled", 0, "cancelled")


def ended_header(
    state: InputState, attempt: int, error: str, phase: str | None = None
) -> OutcomeHeader:
    """The header of an input ended by whoever drives the batch, not by its own run
    (a dead worker or pod, a cancel): ``phase`` only when given."""
    header: OutcomeHeader = {"state": state, "attempt": attempt, "error": error}
    if phase:
        header["phase"] = phase
    return header


def stop_record(reason: StopReason, detail: str, phase: str | None = None) -> StopRecord:
    return {"reason": reason, "detail": detail, "phase": phase}


def load_manifest(data: bytes) -> BatchManifest:
    """A batch's manifest from its bytes (written by the submitting side, trusted).

    :raises ValueError: when ``data`` is not JSON.
    """
    return cast(BatchManifest, load_json(data))


def load_stop(data: bytes) -> StopRecord:
    """A batch's stop record from its bytes. :raises ValueError: when not JSON."""
    return cast(StopRecord, load_json(data))


def load_summary(data: bytes) -> BatchSummary:
    """A batch's summary from its bytes. :raises ValueError: when not JSON."""
    return cast(BatchSummary, load_json(data))


DELIVERY = "at-least-once"
"""An input whose worker or supervisor died mid-run is run again when the batch resumes."""

INPUT_MARKER = "\x1ekinetic-input"
"""Starts the line a worker writes to its log before each input: ``MARKER index``."""


def group_prefix(group_id: str) -> str:
    return f"_groups/{group_id}/"


GROUP_WORK_AREAS: Final = (
    "inputs/", "results/", "logs/", "claims/", "bursts/", "holes/", "commits/", "coordinator/",
)  # fmt: skip
"""What a batch's cleanup deletes under :func:`group_prefix` (the manifest, the recording
and the summary stay): its inputs, its outcomes (objects of their own, a pool's bursts,
a coordinated pool's commits), its logs, a pool's claims and hole announcements, and a
coordinated pool's coordinator records."""


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


_INDEX_DIGITS: Final = 8
"""Hex digits of the input index at the end of a member's job id."""
_ATTEMPT_SEP: Final = "-a"
"""Between a member's job id and the number of a retry (:func:`member_attempt_id`)."""
_HEX: Final = frozenset("0123456789abcdef")


def member_job_id(group_id: str, index: int) -> str:
    """The job id of input ``index`` of a batch: stable, and a valid job id."""
    return f"job-{group_id.removeprefix('grp-')}{index:0{_INDEX_DIGITS}x}"


def attempt_in_group(attempt_id: str, group_id: str) -> bool:
    """Whether ``attempt_id`` is the id of an attempt of an input of ``group_id``: a
    member's job id (:func:`member_job_id`) or a retry's (:func:`member_attempt_id`).

    Exact for group ids of any length: a batch whose id merely starts with the same
    digits is not taken for this one.
    """
    head = member_job_id(group_id, 0)[:-_INDEX_DIGITS]
    if not attempt_id.startswith(head):
        return False
    index, sep, attempt = attempt_id[len(head) :].partition(_ATTEMPT_SEP)
    return (
        len(index) == _INDEX_DIGITS
        and _HEX.issuperset(index)
        and (not sep or (attempt.isascii() and attempt.isdigit()))
    )


def parse_member_job_id(job_id: str) -> tuple[str, int] | None:
    """``(group_id, index)`` of a batch input's job id (:func:`member_job_id`), or None
    for an id that cannot be one (a single job's ids are shorter)."""
    digits = job_id.removeprefix("job-")
    # The index is always the last digits; the group id (8 or more digits) the rest.
    if len(digits) < 8 + _INDEX_DIGITS or not job_id.startswith("job-"):
        return None
    try:
        int(digits, 16)
    except ValueError:
        return None
    return f"grp-{digits[:-_INDEX_DIGITS]}", int(digits[-_INDEX_DIGITS:], 16)


def member_attempt_id(group_id: str, index: int, attempt: int) -> str:
    """The id (Kubernetes ``job-id`` label) of one attempt of a batch input.

    Attempt 0 is the member's job id; a retry gets a suffix, so each attempt is a
    distinct Kubernetes Job whose creation is idempotent (same name on resume).
    """
    base = member_job_id(group_id, index)
    return base if attempt == 0 else f"{base}{_ATTEMPT_SEP}{attempt}"


def group_outcome_key(group_id: str, index: int) -> str:
    """The outcome object of one input of a batch run on GKE (written by its pod)."""
    return f"_groups/{group_id}/results/{index:07d}.res"


def group_member_logs_key(group_id: str, index: int) -> str:
    """The output of one input of a batch run on GKE (its last attempt's)."""
    return f"_groups/{group_id}/logs/{index}.txt"


def encode_outcome(header: OutcomeHeader, payload: bytes) -> bytes:
    """One input's outcome object: a JSON header line (state, phase, error, attempt, the
    payload's SHA-256), then the pickled result payload. The header is readable without
    unpickling."""
    sealed: OutcomeHeader = {**header, "sha256": hashlib.sha256(payload).hexdigest()}
    return dump_json(sealed) + b"\n" + payload


def decode_outcome(data: bytes) -> tuple[OutcomeHeader, bytes]:
    """Split an outcome object into its header and payload.

    :raises ValueError: when ``data`` is not an outcome object, or its payload does not
        match the SHA-256 in its header.
    """
    head, sep, payload = data.partition(b"\n")
    header = load_json(head)
    if not sep or not isinstance(header, dict) or "state" not in header:
        raise ValueError("not a batch outcome object")
    digest = header.pop("sha256", None)  # checked here; not part of what it says
    if digest is not None and hashlib.sha256(payload).hexdigest() != digest:
        raise ValueError("the outcome's payload does not match its SHA-256")
    return cast(OutcomeHeader, header), payload


# --- Batches run by a worker pool on GKE (one Kubernetes Job for the whole batch) ----
#
# The default on GKE (see docs/pool-protocol.md, runner/pool/ and
# kinetic/_backends/gke/pool.py). Besides the records above, per *span* of inputs (a
# worker claims many at once) one claim, and per *burst* of outcomes one object:
#
#   _groups/{group_id}/claims/{start:07d}.{n:03d}   claim n of the span that starts at
#                                                   input start (JSON, ClaimRecord)
#   _groups/{group_id}/bursts/{a:07d}-{b:07d}.{start:07d}.{n:03d}
#                                                   the outcomes of inputs [a, b), run
#                                                   under that claim (see encode_burst)
#   _groups/{group_id}/results/{index:07d}.res      one input's own outcome (a cancel of
#                                                   that input, or a large result); it
#                                                   stands over any burst's record of it
#                                                   (of two bursts' records, the earliest
#                                                   claim's: docs/pool-protocol.md)
#   _groups/{group_id}/holes/{start:07d}.{n:03d}.{end:07d}.{reach:07d}.{slot:07d}.{ms:013d}
#                                                   claim n cut the span: [end, reach)
#                                                   is claimed in slots (hole_name)
#   _groups/{group_id}/holes/settled                every input has an outcome
#
# Claim 0 of a span is its first run. A claim whose lease expired (its worker died) is
# taken over by creating claim n + 1 of the same span: of racing workers exactly one
# wins. Batches recorded before spans (one claim per input, ``{index}.{n}`` without
# ``end``) read as spans of one input.

ENGINE_POOL: Final = "pool"
"""A batch run by one Kubernetes Job whose pods are a pool of workers (GKE default)."""
ENGINE_COORDINATED: Final = "coordinated"
"""A batch run by a worker pool with a coordinator: one Job of workers, one Job of the
coordinator (runner/pool/coordinator/), outcomes in group commits."""
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
    """The content of a claim object: who runs the span, until when it holds."""

    worker: str
    expires: float
    """Wall-clock time (seconds since the epoch) after which the claim is void."""
    end: NotRequired[int]
    """The span is inputs [start, end) (absent in per-input claims: start + 1)."""
    first: NotRequired[int]
    """The first input this claim runs: the span's start for claim 0, the first input
    without an outcome for a takeover (absent: the span's start)."""
    tries: NotRequired[int]
    """How many claims of the span ran input ``first``, this one included; past
    ``max_claims`` it is failed instead (absent: ``number + 1``)."""
    taken_by: NotRequired[str]
    """The worker taking the span over, which ended this claim (the fence that a late
    renewal of it meets) before it creates claim ``number + 1``."""
    reach: NotRequired[int]
    """Where the span's link of its region's chain ends (absent: ``end``). A takeover
    that runs only part of a dead worker's span has ``end < reach``: inputs
    ``[end, reach)`` are then claimed afresh, as spans of their own."""
    slot: NotRequired[int]
    """With ``reach``: the size of the spans the rest is cut into, from ``end`` on."""


def batch_engine(manifest: BatchManifest) -> BatchEngine:
    """The engine that runs a recorded GKE batch (batches recorded before pools existed
    ran one Job per input)."""
    gke = manifest.get("gke")
    engine = gke.get("engine") if gke is not None else None
    if engine == ENGINE_COORDINATED:
        return ENGINE_COORDINATED
    return ENGINE_POOL if engine == ENGINE_POOL else ENGINE_POD_PER_INPUT


def group_claims_prefix(group_id: str) -> str:
    return f"_groups/{group_id}/claims/"


def group_claim_key(group_id: str, start: int, number: int) -> str:
    """Claim ``number`` (0 first) of the span that starts at input ``start``."""
    return f"_groups/{group_id}/claims/{start:07d}.{number:03d}"


def group_holes_prefix(group_id: str) -> str:
    """Where a pool's cut takeovers are announced (:func:`hole_name`): a listing of a
    few names, which idle workers make often, instead of every claim."""
    return f"_groups/{group_id}/holes/"


POOL_SETTLED_NAME: Final = "settled"
"""An empty object in a pool's :func:`group_holes_prefix`, created by the first worker
that saw every input with an outcome: idle workers list that folder often (every claim
and burst seldom), and exit once they see it."""


def hole_name(start: int, number: int, end: int, reach: int, slot: int, expires: float) -> str:
    """The name (relative to :func:`group_holes_prefix`) of an empty object that
    announces claim ``number`` of the span at ``start``, which cut it: it runs up to
    ``end``, and inputs ``[end, reach)`` are a hole claimed in slots of ``slot``; the
    claim's first lease ended at ``expires`` (wall-clock seconds, kept to the
    millisecond: how recent the hole is, whose slots are then likely free)."""
    ms = round(expires * 1000)
    return f"{start:07d}.{number:03d}.{end:07d}.{reach:07d}.{slot:07d}.{ms:013d}"


def parse_hole_name(name: str) -> tuple[int, int, int, int, int, float] | None:
    """``(start, number, end, reach, slot, expires)`` of a hole's name (see
    :func:`hole_name`)."""
    parts = name.split(".")
    if len(parts) != 6 or not all(p.isascii() and p.isdigit() for p in parts):
        return None
    start, number, end, reach, slot, ms = (int(p) for p in parts)
    if not (start <= end < reach and slot > 0):
        return None
    return start, number, end, reach, slot, ms / 1000


def group_bursts_prefix(group_id: str) -> str:
    return f"_groups/{group_id}/bursts/"


def burst_name(first: int, end: int, start: int, number: int) -> str:
    """The name (relative to :func:`group_bursts_prefix`) of the burst of inputs
    ``[first, end)`` run under claim ``number`` of the span starting at ``start``."""
    return f"{first:07d}-{end:07d}.{start:07d}.{number:03d}"


def parse_burst_name(name: str) -> tuple[int, int, int, int] | None:
    """``(first, end, start, number)`` of a burst's name (see :func:`burst_name`)."""
    parts = name.split(".")
    if len(parts) != 3:
        return None
    first, dash, end = parts[0].partition("-")
    fields = (first, end, parts[1], parts[2])
    if not dash or not all(f.isascii() and f.isdigit() for f in fields):
        return None
    a, b, start, number = (int(f) for f in fields)
    return (a, b, start, number) if a < b else None


BURST_MAGIC: Final = b"KNB1\n"


def encode_burst(records: bytes) -> bytes:
    """A burst object: :data:`BURST_MAGIC`, then framed outcome records
    (:func:`runner.results_log.encode`), one per input that has one."""
    return BURST_MAGIC + records


def parse_claim_name(name: str) -> tuple[int, int] | None:
    """``(start, number)`` of a claim object's name relative to the claims prefix."""
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


def idle_line(job_id: str, host: int) -> str:
    """What a multi-host job's restarted container says first (and only): its host ran
    already, and it idles. A reader of the pod's live log that meets this line reads the
    restarted container's log, not the job's."""
    return f"kinetic runner: host {host} of job {job_id} already ran; idle until it is deleted\n"


def parse_host_key(job_id: str, key: str) -> tuple[int, str] | None:
    """``(host, name)`` of an object key under :func:`hosts_prefix`, else None."""
    rest = key.removeprefix(hosts_prefix(job_id))
    head, sep, name = rest.partition("/")
    if rest == key or not sep or not head.isdigit():
        return None
    return int(head), name
