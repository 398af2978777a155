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
import hashlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cloudpickle

from runner import protocol
from runner._fs import remove_tree
from runner._store import RunnerStore, open_store

if TYPE_CHECKING:
    from runner.gpu_lease import GpuLease


class _Namespace:
    def __init__(self, storage: str, job_id: str, upload_logs: bool) -> None:
        self.storage, self.job_id, self.upload_logs = storage, job_id, upload_logs


class PhaseError(Exception):
    """A runner step failed outside the user's code."""

    def __init__(self, phase: str, message: str) -> None:
        super().__init__(message)
        self.phase = phase


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
    try:
        spec = protocol.load_json(store.read(protocol.spec_key(job_id)))
        payload_bytes = store.read(protocol.payload_key(job_id))
        phase = "verify"
        _verify(payload_bytes, spec["payload_sha256"], "payload.pkl")
        code_root = prepare_workspace(store, spec, workdir)

        phase = "deserialize"
        payload = cloudpickle.loads(payload_bytes)
        fn, args, kwargs = payload["fn"], payload["args"], payload["kwargs"]

        phase = "resolve"
        if spec.get("has_data"):
            from runner.data import resolve_arguments

            volumes = payload.get("volumes") or []
            args, kwargs = resolve_arguments(store, args, kwargs, workdir, volumes)

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
    try:
        value = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - SystemExit too: it must not skip the record
        import traceback

        traceback.print_exc()
        _record_failure(store, job_id, phase, exc, user=True, host=host)
        return protocol.EXIT_USER_ERROR
    _flush_std()
    return _record_success(store, job_id, value, host=host)


def prepare_workspace(store: RunnerStore, spec: protocol.JobSpec, workdir: Path) -> Path:
    """Fetch, verify and unpack the context archive, enter it (cwd, sys.path, env), then
    install the spec's requirements (prebuilt mode). Return the root of the project's
    files (the shared tree, or the job's own copy).

    On the local backend (``KINETIC_CONTEXT_CACHE`` names a shared cache) the archive is
    extracted once per content address and shared read-only; the job's cwd is its own
    directory of links into it (:mod:`runner._contexts`). Elsewhere (a pod, which runs
    one job) it is extracted into ``workdir``.

    :raises PhaseError: naming the phase (fetch, verify, unpack, install) that failed.
    """
    root = workdir / "workspace"
    root.mkdir(parents=True, exist_ok=True)
    code_root = root
    cwd = root / spec["cwd"] if spec["cwd"] else root
    shared = os.environ.pop("KINETIC_CONTEXT_CACHE", None)
    if spec.get("context_key"):
        if shared:
            tree = _shared_context(store, spec, Path(shared), root)
            if tree is not None:
                code_root, cwd = tree
        if code_root is root:
            _unpack(_fetch_context(store, spec), root)
    _enter_workspace(root, spec, code_root, cwd)
    if spec.get("install"):
        from runner.install import install_requirements

        install_requirements(spec.get("install", []), workdir)
    return code_root


def _fetch_context(store: RunnerStore, spec: protocol.JobSpec) -> bytes:
    try:
        data = store.read(str(spec["context_key"]))
    except OSError as exc:
        raise PhaseError("fetch", f"cannot read the context archive: {exc}") from exc
    _verify(data, str(spec["context_sha256"]), "context archive")
    return data


def _shared_context(
    store: RunnerStore, spec: protocol.JobSpec, cache: Path, root: Path
) -> tuple[Path, Path] | None:
    """The shared tree and the job's cwd in ``root``; ``None`` if the cache is unusable."""
    from runner import _contexts

    try:
        tree = _contexts.claim(
            cache, str(spec["context_sha256"]), lambda: _fetch_context(store, spec)
        )
        return tree, _contexts.link_workspace(tree, root, spec["cwd"])
    except _contexts.UnpackError as exc:
        raise PhaseError("unpack", str(exc)) from exc
    except OSError as exc:
        _contexts.warn(f"shared context cache unusable ({exc}); unpacking for this job only")
        remove_tree(root)
        root.mkdir(parents=True, exist_ok=True)
        return None


def _verify(data: bytes, expected: str, what: str) -> None:
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise PhaseError("verify", f"{what} is corrupted: sha256 {actual} != expected {expected}")


def _unpack(archive: bytes, root: Path) -> None:
    from runner._contexts import UnpackError, extract

    try:
        extract(archive, root)
    except UnpackError as exc:
        raise PhaseError("unpack", str(exc)) from exc
    except Exception as exc:
        raise PhaseError("unpack", f"cannot unpack the context archive: {exc}") from exc


def _enter_workspace(root: Path, spec: protocol.JobSpec, code_root: Path, cwd: Path) -> None:
    os.environ.update(spec["env"])
    os.environ["KINETIC_OUTPUT_DIR"] = spec["output_dir"]
    os.environ["JOB_ID"] = spec["job_id"]
    if spec["output_dir"].startswith("/"):
        Path(spec["output_dir"]).mkdir(parents=True, exist_ok=True)
    entries = [str(code_root / rel) if rel else str(code_root) for rel in spec["sys_path"]]
    sys.path[:0] = [*entries, str(code_root)]
    # The project's cwd may be a folder that did not travel (ignored): start it empty.
    cwd.mkdir(parents=True, exist_ok=True)
    os.chdir(cwd)


def build_success(value: Any) -> tuple[bytes, protocol.FinalRecord]:
    """The result payload and final record for a value (a serialize failure if it won't pickle)."""
    try:
        data = cloudpickle.dumps(protocol.result_payload(success=True, result=value))
    except BaseException as exc:  # noqa: BLE001 - pickling may raise anything
        return build_failure("serialize", exc, user=False, what="the result")
    final: protocol.FinalRecord = {
        "state": "succeeded",
        "phase": None,
        "error": None,
        "error_type": None,
    }
    return data, final


def build_failure(
    phase: str, exc: BaseException, *, user: bool, what: str | None = None
) -> tuple[bytes, protocol.FinalRecord]:
    """The result payload and final record for a failure. Call from the ``except`` block."""
    import traceback  # only on failure: it is slow to import

    tb = traceback.format_exc()
    error_type = f"{type(exc).__module__}.{type(exc).__qualname__}"
    error = f"{type(exc).__name__}: {exc}"
    if what is not None:
        error = f"{what} cannot be pickled: {error}"
    # Only ordinary exceptions raised by the user's code are re-raised locally;
    # SystemExit, KeyboardInterrupt and runner failures become Kinetic errors.
    carry = exc if user and isinstance(exc, Exception) else None
    payload = protocol.result_payload(
        success=False,
        exception=carry,
        traceback=tb,
        phase=phase,
        error=error,
        error_type=error_type,
    )
    try:
        data = cloudpickle.dumps(payload)
        cloudpickle.loads(data)  # an exception that pickles may still fail to rebuild
    except BaseException:  # noqa: BLE001
        payload["exception"] = None
        data = cloudpickle.dumps(payload)
    final: protocol.FinalRecord = {
        "state": "failed",
        "phase": phase,
        "error": error,
        "error_type": error_type,
    }
    return data, final


def _record_success(store: RunnerStore, job_id: str, value: Any, host: int | None = None) -> int:
    data, final = build_success(value)
    code = protocol.EXIT_OK if final["state"] == "succeeded" else protocol.EXIT_RUNNER_ERROR
    return _upload(store, job_id, data, final, code, host)


def _record_failure(
    store: RunnerStore,
    job_id: str,
    phase: str,
    exc: BaseException,
    *,
    user: bool,
    host: int | None = None,
) -> None:
    data, final = build_failure(phase, exc, user=user)
    print(
        f"kinetic runner: job {job_id} failed in phase {phase}: {final['error']}", file=sys.stderr
    )
    _upload(store, job_id, data, final, protocol.EXIT_RUNNER_ERROR, host)


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
        store.write(result_key, data)
        store.write(final_key, protocol.dump_json(final))
    except BaseException as exc:  # noqa: BLE001
        print(f"kinetic runner: could not record the result ({exc})", file=sys.stderr)
        return protocol.EXIT_RUNNER_ERROR
    return code


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()


def parse_args(argv: Sequence[str], flags: set[str]) -> dict[str, str | bool]:
    """``--name value`` options and ``--flag`` switches (argparse costs ~7 ms to import).

    :raises SystemExit: with usage, on an unknown or incomplete option.
    """
    out: dict[str, str | bool] = {}
    it = iter(argv)
    for arg in it:
        name = arg.removeprefix("--")
        if not arg.startswith("--") or name in out:
            raise SystemExit(f"kinetic runner: unexpected argument {arg!r}")
        if name in flags:
            out[name] = True
            continue
        value = next(it, None)
        if value is None:
            raise SystemExit(f"kinetic runner: {arg} needs a value")
        out[name] = value
    return out


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
    workdir = Path(os.environ.get("TMPDIR") or "/tmp", f"kinetic-run-{os.urandom(8).hex()}")
    workdir.mkdir(mode=0o700)
    lease: GpuLease | None = None
    try:
        # A local GPU job waits for its GPUs and holds them until it exits (the name is
        # runner.gpu_lease.REQUEST_ENV, spelled out: the module loads only when needed).
        if "KINETIC_GPU_REQUEST" in os.environ:
            from runner.gpu_lease import hold_for_job

            lease = hold_for_job(store, ns.job_id)
        logs_key = protocol.logs_key(ns.job_id)
        if host is not None:
            # A multi-host job's pods restart a container that exits (StatefulSet pods
            # must): a host runs the job once, and a restarted container only idles.
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
        os.chdir("/")
        remove_tree(workdir)
        store.close()


def _idle(job_id: str, host: int) -> int:
    """Do nothing until the pod is deleted: this host already ran (or started) its part
    of the job, and Kinetic never runs it again. SIGTERM ends the wait (as PID 1, the
    runner would ignore it without a handler)."""
    import signal
    import time

    print(
        f"kinetic runner: host {host} of job {job_id} already ran; idle until it is deleted",
        file=sys.stderr,
        flush=True,
    )
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
    workdir = Path(os.environ.get("TMPDIR") or "/tmp", f"kinetic-run-{os.urandom(8).hex()}")
    workdir.mkdir(mode=0o700)
    try:
        if args.get("upload-logs"):
            from runner._tee import captured_output

            with captured_output(store, protocol.group_member_logs_key(group, index)):
                return run_member(store, group, index, attempt, workdir)
        return run_member(store, group, index, attempt, workdir)
    finally:
        os.chdir("/")
        remove_tree(workdir)
        store.close()
