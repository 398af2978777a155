"""The runner's main sequence: fetch, verify, unpack, deserialize, execute, record.

Theory of operation: every step runs inside a named phase. Whatever happens
(an exception of the user's, ``SystemExit``, a corrupt artifact, an
unpicklable result), the runner tries to leave two objects behind: the
result payload (``result.pkl``) and, after it, the small final record
(``status.json``) that tells observers the job is over and which phase failed.
Observers treat a runner that exits without a final record as FAILED, so a
runner killed by a signal never leaves a job looking alive.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cloudpickle

from runner import preemption, protocol
from runner.code_files import restore_code_files
from runner.isolation import enter_job_namespaces
from runner.job import (
    build_failure,
    build_success,
    parse_args,
    prepare_workspace,
    verify,
)
from runner.protocol import PhaseError
from runner.retry_rule import RetryRule
from runner.scratch import scratch_dir
from runner.store import RunnerStore, open_store
from runner.time_limit import TimeLimit, TimeLimitExceeded, call_limited, reached

if TYPE_CHECKING:
    from runner.gpu_lease import GpuLease


class _Namespace:
    def __init__(self, storage: str, job_id: str, upload_logs: bool) -> None:
        self.storage, self.job_id, self.upload_logs = storage, job_id, upload_logs


def run_job(
    store: RunnerStore,
    job_id: str,
    *,
    workdir: Path,
    host: int | None = None,
) -> int:
    """Run one job whose artifacts are in ``store``; return the process exit status.

    Never raises for job-level failures: they are recorded in storage (as host
    ``host``'s outcome in a multi-host job).
    """
    phase = "fetch"
    pod = preemption.pod_name(os.environ) if host is None else None
    try:
        if preemption.settled(store, job_id, pod):
            print(f"kinetic runner: job {job_id} already ended; its outcome stands", flush=True)
            return protocol.EXIT_OK
        spec = protocol.load_json(store.read(protocol.spec_key(job_id)))
        # A pod before this one lost mid-attempt: that attempt failed (runner/preemption.py).
        attempt, attempts = preemption.resume(store, job_id, pod)
        # Before any of the job's code runs, while this process has one thread.
        enter_job_namespaces(store, spec, host)
        payload_bytes = store.read(protocol.payload_key(job_id))
        phase = "verify"
        verify(payload_bytes, spec["payload_sha256"], "payload.pkl")
        new_output_dir = _new_local_dir(spec["output_dir"])
        code_root = prepare_workspace(store, spec, workdir)

        phase = "deserialize"
        payload = cloudpickle.loads(payload_bytes)
        fn, args, kwargs = payload["fn"], payload["args"], payload["kwargs"]
        restore_code_files(fn)

        phase = "resolve"
        if spec.get("has_data"):
            from runner.data import resolve_arguments

            volumes = payload.get("volumes") or []
            args, kwargs = resolve_arguments(
                store,
                args,
                kwargs,
                workdir,
                volumes,
                private_volumes=bool(spec.get("private_volumes")),
            )

        # debug=True: wait (bounded) for a debugger client; host 0 only in multi-host jobs.
        debug = spec.get("debug")
        if debug is not None and not host:
            phase = "debug"
            from runner.debug import wait_for_client

            wait_for_client(store, job_id, debug, fn, code_root=code_root, host=host)
    except BaseException as exc:  # noqa: BLE001 - every failure must be recorded
        if isinstance(exc, PhaseError):
            phase = exc.phase
        _record_failure(store, job_id, phase, exc, user=False, host=host)
        return protocol.EXIT_RUNNER_ERROR

    phase = "execute"
    retries = spec.get("retries") if host is None else None  # hosts run in step: never alone
    final: dict[str, Any] = {}  # what a job that retries adds to its final record
    if attempts and not preemption.allowed(retries, attempt):
        final.update(attempt=attempt - 1, attempts=attempts[:-1])
        lost = preemption.Preempted(attempts[-1]["error"])
        _record_failure(store, job_id, protocol.PREEMPTED_PHASE, lost, user=False, final=final)
        return protocol.EXIT_RUNNER_ERROR
    try:
        while True:
            started = time.time()
            preemption.mark(store, job_id, pod, attempt)
            os.environ["KINETIC_ATTEMPT"] = str(attempt - 1)  # 0 first, as a batch input's
            if retries is not None or attempt > 1:
                final.update(attempt=attempt, attempts=list(attempts))
            ok, outcome = _attempt(store, job_id, spec, host, final, (fn, args, kwargs))
            if ok or not _retried(retries, outcome, attempt):
                break
            kind = type(outcome)
            error = f"{kind.__name__}: {outcome}"
            attempts.append(
                {
                    "attempt": attempt,
                    "started": started,
                    "ended": time.time(),
                    "phase": phase,
                    "error": error,
                    "error_type": f"{kind.__module__}.{kind.__qualname__}",
                }
            )
            _record_attempts(store, job_id, attempts)
            assert retries is not None
            delay = RetryRule.of_record(retries).delay(attempt)
            print(
                f"kinetic runner: attempt {attempt} of job {job_id} failed ({error}); "
                f"attempt {attempt + 1} of {retries['count'] + 1} in {delay:g} s",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(delay)
            attempt += 1
    finally:
        if new_output_dir is not None:  # made for the job, and it wrote nothing there
            with contextlib.suppress(OSError):
                new_output_dir.rmdir()
    if not ok:
        user = not isinstance(outcome, TimeLimitExceeded)
        _record_failure(store, job_id, phase, outcome, user=user, host=host, final=final)
        return protocol.EXIT_USER_ERROR
    _flush_std()
    return _record_success(store, job_id, outcome, host=host, final=final)


def _attempt(
    store: RunnerStore,
    job_id: str,
    spec: protocol.JobSpec,
    host: int | None,
    final: dict[str, Any],
    call: tuple[Any, Any, Any],
) -> tuple[bool, Any]:
    """Run the function once, under the job's run-time limit: ``(True, value)`` or
    ``(False, exception)`` (a :class:`TimeLimitExceeded` when the limit was reached,
    whatever the function made of it)."""
    fn, args, kwargs = call
    return call_limited(_time_limit(store, job_id, spec, host, final), fn, args, kwargs)


def _retried(retries: protocol.RetriesRecord | None, exc: BaseException, attempt: int) -> bool:
    """Whether attempt ``attempt``'s exception is retried (:mod:`runner.retry_rule`)."""
    return RetryRule.of_record(retries).delay_after(attempt - 1, exc) is not None


def _record_attempts(
    store: RunnerStore, job_id: str, attempts: list[protocol.AttemptRecord]
) -> None:
    """Say the failed attempts so far (best effort: the final record says them too)."""
    try:
        store.write(protocol.attempts_key(job_id), protocol.dump_json(attempts))
    except Exception as exc:  # noqa: BLE001 - a retry must not fail for its bookkeeping
        print(f"kinetic runner: could not record the attempts ({exc})", file=sys.stderr)


def _time_limit(
    store: RunnerStore,
    job_id: str,
    spec: protocol.JobSpec,
    host: int | None,
    final: dict[str, Any],
) -> TimeLimit | None:
    """The job's run-time limit (``spec["timeout"]``), not started; None without one.
    When the function does not unwind after it, the watchdog records the failure."""
    seconds = spec.get("timeout")
    if seconds is None:
        return None
    limit = TimeLimit(
        float(seconds),
        lambda: _record_failure(
            store, job_id, "execute", limit.error(), user=False, host=host, final=final
        ),
    )
    return limit


def _new_local_dir(path: str) -> Path | None:
    """``path`` when it is a local directory that does not exist yet (the job's
    workspace creates it); None otherwise. An empty one is removed after the job, so
    jobs that write no outputs leave no directory each behind them."""
    if not path.startswith("/") or os.path.lexists(path):
        return None
    return Path(path)


def _record_success(
    store: RunnerStore,
    job_id: str,
    value: Any,
    host: int | None = None,
    final: dict[str, Any] | None = None,
) -> int:
    data, record = build_success(value)
    record.update(final or {})  # type: ignore[typeddict-item]
    code = protocol.EXIT_OK if record["state"] == "succeeded" else protocol.EXIT_RUNNER_ERROR
    return _upload(store, job_id, data, record, code, host)


def _record_failure(
    store: RunnerStore,
    job_id: str,
    phase: str,
    exc: BaseException,
    *,
    user: bool,
    host: int | None = None,
    final: dict[str, Any] | None = None,
) -> None:
    data, record = build_failure(phase, exc, user=user)
    record.update(final or {})  # type: ignore[typeddict-item]
    print(
        f"kinetic runner: job {job_id} failed in phase {phase}: {record['error']}", file=sys.stderr
    )
    _upload(store, job_id, data, record, protocol.EXIT_RUNNER_ERROR, host)


def _upload(
    store: RunnerStore,
    job_id: str,
    data: bytes,
    final: protocol.FinalRecord,
    code: int,
    host: int | None = None,
) -> int:
    _flush_std()
    if host is None:
        result_key, final_key = protocol.result_key(job_id), protocol.final_key(job_id)
    else:  # one host of a multi-host job: its own outcome; the submitter composes the job's
        result_key = protocol.host_result_key(job_id, host)
        final_key = protocol.host_final_key(job_id, host)
    try:
        store.write(result_key, protocol.seal(data))
    except BaseException as exc:  # noqa: BLE001
        print(f"kinetic runner: could not record the result ({exc})", file=sys.stderr)
        # A small record of why often still fits (a full disk, a store refusing large
        # objects): then the job fails in phase "upload", naming the cause.
        data, final = build_failure("upload", exc, user=False, what=None)
        code = protocol.EXIT_RUNNER_ERROR
        try:
            store.write(result_key, protocol.seal(data))
        except BaseException:  # noqa: BLE001
            return code
    try:
        store.write(final_key, protocol.dump_json(final))
    except BaseException as exc:  # noqa: BLE001
        print(f"kinetic runner: could not record the final state ({exc})", file=sys.stderr)
        return protocol.EXIT_RUNNER_ERROR
    return code


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``python -m runner --storage URL --job-id ID [--upload-logs]``, or for
    one input of a batch ``--storage URL --group GID --index I --attempt A [--upload-logs]``."""
    args = parse_args(sys.argv[1:] if argv is None else argv, {"upload-logs"})
    if isinstance(args.get("group"), str):
        return _member_main(args)
    if not isinstance(args.get("storage"), str) or not isinstance(args.get("job-id"), str):
        raise SystemExit("usage: python -m runner --storage URL --job-id ID [--upload-logs]")
    ns = _Namespace(str(args["storage"]), str(args["job-id"]), bool(args.get("upload-logs")))
    try:
        host = protocol.host_index(os.environ)
    except ValueError as exc:
        raise SystemExit(f"kinetic runner: {exc}") from None
    store = open_store(ns.storage)
    lease: GpuLease | None = None
    try:
        with scratch_dir("job") as workdir:
            # A local GPU job waits for its GPUs and holds them until it exits (the name
            # is runner.gpu_lease.REQUEST_ENV, spelled out: the module loads only when
            # needed).
            if "KINETIC_GPU_REQUEST" in os.environ:
                from runner.gpu_lease import hold_for_job

                lease = hold_for_job(store, ns.job_id)
            logs_key = protocol.logs_key(ns.job_id)
            if host is not None:
                # A multi-host job's pods restart a container that exits (StatefulSet
                # pods must): a host runs the job once, and a restarted container idles.
                if not store.create_if_absent(protocol.host_started_key(ns.job_id, host), b"{}"):
                    return _idle(ns.job_id, host)
                logs_key = protocol.host_logs_key(ns.job_id, host)
            if ns.upload_logs:
                from runner._tee import captured_output

                with captured_output(store, logs_key):
                    return run_job(store, ns.job_id, workdir=workdir, host=host)
            return run_job(store, ns.job_id, workdir=workdir, host=host)
    finally:
        if lease is not None:
            lease.close()
        store.close()
        if reached():  # recorded, logs uploaded: end whatever the job started too
            TimeLimit.end_group()


def _idle(job_id: str, host: int) -> int:
    """Do nothing until the pod is deleted: this host already ran (or started) its part
    of the job, and Kinetic never runs it again. SIGTERM ends the wait (as PID 1, the
    runner would ignore it without a handler)."""
    import signal
    import time

    print(protocol.idle_line(job_id, host), end="", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)


def _member_main(args: dict[str, str | bool]) -> int:
    """Member mode (see :mod:`runner._member`)."""
    from runner._member import run_member

    try:
        storage, group = str(args["storage"]), str(args["group"])
        index, attempt = int(str(args["index"])), int(str(args.get("attempt", "0")))
    except (KeyError, ValueError):
        raise SystemExit(
            "usage: python -m runner --storage URL --group GID --index I [--attempt A] "
            "[--upload-logs]"
        ) from None
    store = open_store(storage)
    try:
        with scratch_dir("job") as workdir:
            if args.get("upload-logs"):
                from runner._tee import captured_output

                with captured_output(store, protocol.group_member_logs_key(group, index)):
                    return run_member(store, group, index, attempt, workdir)
            return run_member(store, group, index, attempt, workdir)
    finally:
        store.close()
