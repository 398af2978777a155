"""One input of a batch, run as its own job (a GKE pod): the runner's member mode.

``python -m runner --storage gs://B --group GID --index I --attempt A --upload-logs``

Reads the batch's manifest (the spec), its function (``fn.pkl``, SHA-256 checked
against the spec) and the input's chunk, runs the input, and writes at most two
objects: the outcome (:func:`runner.protocol.group_outcome_key`: a JSON header
and the result payload) and, with ``--upload-logs``, the output
(:func:`runner.protocol.group_member_logs_key`).

A failed attempt that will be retried (:mod:`runner.retry_rule`: attempts left, and with
a ``kinetic.Retries`` an exception its ``on`` names) writes no outcome: it exits
non-zero, and the driver of the batch starts the next attempt, which first waits out the
back-off (in its pod: the driver knows nothing of delays). The final attempt always
records its outcome, success or failure. A pod killed before it recorded one is
recognised by the driver, which then records the failure (or retries).
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

import cloudpickle

from runner import protocol
from runner.code_files import load_function
from runner.job import build_failure, build_success, prepare_workspace
from runner.protocol import PhaseError
from runner.retry_rule import RetryRule
from runner.store import RunnerStore
from runner.time_limit import TimeLimit, TimeLimitExceeded, call_limited


def run_member(store: RunnerStore, group_id: str, index: int, attempt: int, workdir: Path) -> int:
    """Run input ``index`` of batch ``group_id``; return the process exit status.

    Never raises for failures of the input: they are recorded as its outcome (on the
    final attempt) or left for a retry.
    """
    phase = "fetch"
    final = True
    try:
        manifest = protocol.load_manifest(store.read(protocol.group_manifest_key(group_id)))
        rule = RetryRule.of_batch(manifest["options"])
        # A failure before the function is retried by a plain count only (the same again).
        final = rule.on is not None or attempt >= rule.count
        spec = manifest["spec"]
        fn_bytes = store.read(protocol.group_payload_key(group_id))
        chunk, offset = divmod(index, int(manifest["chunk_size"]))
        chunk_bytes = store.read(protocol.group_inputs_key(group_id, chunk))
        phase = "verify"
        if hashlib.sha256(fn_bytes).hexdigest() != spec["payload_sha256"]:
            raise PhaseError("verify", "fn.pkl is corrupted: its sha256 does not match")
        prepare_workspace(store, spec, workdir)
        job_id = protocol.member_job_id(group_id, index)
        os.environ["JOB_ID"] = job_id
        os.environ["KINETIC_OUTPUT_DIR"] = f"{spec['output_dir'].rstrip('/')}/{job_id}"
        os.environ["KINETIC_ATTEMPT"] = str(attempt)  # 0 first, then 1, 2, ... on retries
        phase = "deserialize"
        fn = load_function(fn_bytes)
        args, kwargs = cloudpickle.loads(chunk_bytes)[offset]
        phase = "resolve"
        if spec.get("has_data"):
            from runner.data import resolve_arguments

            args, kwargs = resolve_arguments(store, args, kwargs, workdir)
    except BaseException as exc:  # noqa: BLE001 - every failure must be recorded
        if isinstance(exc, PhaseError):
            phase = exc.phase
        data, record = build_failure(phase, exc, user=False)
        print(f"kinetic runner: input {index} failed in phase {phase}: {record['error']}")
        if final:
            _record(store, group_id, index, attempt, data, record)
        return protocol.EXIT_RUNNER_ERROR
    if attempt > 0:
        time.sleep(rule.delay(attempt))  # the back-off before retry number `attempt`
    limit = _time_limit(store, group_id, index, attempt, spec)
    ok, outcome = call_limited(limit, fn, args, kwargs)
    if ok:
        data, record = build_success(outcome)
    elif isinstance(outcome, TimeLimitExceeded):  # recorded now, never retried
        data, record = build_failure("execute", outcome, user=False)
    elif rule.delay_after(attempt, outcome) is not None:
        return protocol.EXIT_USER_ERROR  # the driver starts the next attempt
    else:
        data, record = build_failure("execute", outcome, user=True)
    return _record(store, group_id, index, attempt, data, record)


def _time_limit(
    store: RunnerStore, group_id: str, index: int, attempt: int, spec: protocol.JobSpec
) -> TimeLimit | None:
    """The input's run-time limit (the batch's ``spec["timeout"]``), not started."""
    seconds = spec.get("timeout")
    if seconds is None:
        return None

    def record() -> None:  # the watchdog's, when the function did not unwind
        data, outcome = build_failure("execute", limit.error(), user=False)
        _record(store, group_id, index, attempt, data, outcome)

    limit = TimeLimit(float(seconds), record)
    return limit


def _record(
    store: RunnerStore,
    group_id: str,
    index: int,
    attempt: int,
    data: bytes,
    record: protocol.FinalRecord,
) -> int:
    """Write the outcome object (one write); the exit status to end with."""
    header = protocol.outcome_header(attempt, record)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    try:
        store.write(
            protocol.group_outcome_key(group_id, index), protocol.encode_outcome(header, data)
        )
    except BaseException as exc:  # noqa: BLE001
        print(f"kinetic runner: could not record the outcome ({exc})", file=sys.stderr)
        return protocol.EXIT_RUNNER_ERROR
    return protocol.EXIT_OK if record["state"] == "succeeded" else protocol.EXIT_RUNNER_ERROR
