"""One job's building blocks, shared by every way the runner runs a job.

The single-job runner (:mod:`runner._main`), a local batch's workers
(:mod:`runner.batch`), a GKE batch input (:mod:`runner._member`) and the GKE pool
(:mod:`runner.pool.worker`) all prepare the same workspace, fail in the same named phases
and record outcomes in the same shape: those steps live here, below all of them.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cloudpickle

from runner import protocol
from runner.fs import make_private_dirs, remove_tree
from runner.protocol import PhaseError
from runner.store import RunnerStore


def prepare_workspace(store: RunnerStore, spec: protocol.JobSpec, workdir: Path) -> Path:
    """Check the spec, fetch, verify and unpack the context archive, enter it (cwd,
    sys.path, env), then install the spec's requirements, then its ``# kn:keep`` lines
    (prebuilt mode), then resolve the local secrets it names (:mod:`runner.secrets`) into
    its environment. Return the root of the project's files (the shared tree, or the
    job's own copy).

    On the local backend (``KINETIC_CONTEXT_CACHE`` names a shared cache) the archive is
    extracted once per content address and shared read-only; the job's cwd is its own
    directory of links into it (:mod:`runner.contexts`). Elsewhere (a pod, which runs
    one job) it is extracted into ``workdir``.

    :raises PhaseError: naming the phase (fetch, verify, unpack, install, secrets) that
        failed.
    """
    protocol.check_spec(spec)
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
    install, kept = spec.get("install", []), spec.get("install_kept", [])
    if install or kept:
        from runner.install import install_requirements

        if install:
            install_requirements(install, workdir)
        if kept:  # the user's override: last, and resolved on its own
            install_requirements(kept, workdir, kept=True)
    if spec.get("secrets"):
        _enter_secrets(spec)
    _check_mounted_secrets()
    return code_root


def _check_mounted_secrets() -> None:
    """:raises PhaseError: (phase ``secrets``) a pod's mounted Secret is missing."""
    from runner.secrets import MOUNTS_ENV, SecretError, check_mounted

    if MOUNTS_ENV not in os.environ:
        return
    try:
        check_mounted(os.environ)
    except SecretError as exc:
        raise PhaseError("secrets", str(exc)) from None


def _enter_secrets(spec: protocol.JobSpec) -> None:
    """Put the spec's local secrets in the environment, as a pod gets them: every key of
    a whole secret below the captured variables, mapped keys above them, Kinetic's own
    variables above all.

    :raises PhaseError: (phase ``secrets``) naming the secret that cannot be resolved.
    """
    from runner.secrets import SecretError, resolve

    try:
        found = resolve(spec.get("secrets", []), os.environ)
    except SecretError as exc:
        raise PhaseError("secrets", str(exc)) from None
    own = {"JOB_ID", *spec["env"]}
    for name, value in found.whole.items():
        if name not in own and not name.startswith("KINETIC_"):
            os.environ[name] = value
    for name, value in found.mapped.items():
        if name != "JOB_ID" and not name.startswith("KINETIC_"):
            os.environ[name] = value


def _fetch_context(store: RunnerStore, spec: protocol.JobSpec) -> bytes:
    try:
        data = store.read(str(spec["context_key"]))
    except OSError as exc:
        raise PhaseError("fetch", f"cannot read the context archive: {exc}") from exc
    verify(data, str(spec["context_sha256"]), "context archive")
    return data


def _shared_context(
    store: RunnerStore, spec: protocol.JobSpec, cache: Path, root: Path
) -> tuple[Path, Path] | None:
    """The shared tree and the job's cwd in ``root``; ``None`` if the cache is unusable."""
    from runner import contexts

    try:
        tree = contexts.claim(
            cache, str(spec["context_sha256"]), lambda: _fetch_context(store, spec)
        )
        return tree, contexts.link_workspace(tree, root, spec["cwd"])
    except contexts.UnpackError as exc:
        raise PhaseError("unpack", str(exc)) from exc
    except OSError as exc:
        contexts.warn(f"shared context cache unusable ({exc}); unpacking for this job only")
        remove_tree(root)
        root.mkdir(parents=True, exist_ok=True)
        return None


def verify(data: bytes, expected: str, what: str) -> None:
    """:raises PhaseError: in phase ``verify`` when ``data`` is not what was recorded."""
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise PhaseError("verify", f"{what} is corrupted: sha256 {actual} != expected {expected}")


def _unpack(archive: bytes, root: Path) -> None:
    from runner.contexts import UnpackError, extract

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
        # Private, as everything under a local root: a job's outputs (model weights, say)
        # are its user's alone, whatever the umask.
        make_private_dirs(Path(spec["output_dir"]))
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

    tb = "".join(traceback.format_exception(exc))  # format_exc() when exc is being handled
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
