"""Debug mode, the job's side: start debugpy, say where it listens, wait for a client.

A job submitted with ``debug=True`` carries a ``debug`` entry in its spec (seconds to
wait, the project's path on the submitting machine). After its arguments are resolved
and before the function runs, the runner

1. imports debugpy (Kinetic's images carry it; on the local backend it must be
   installed in the interpreter that runs jobs) and starts its adapter on
   ``127.0.0.1`` at a free port: never on a public interface, since debugpy runs
   whatever its client sends. In a pod, that loopback is the pod's own, and the
   submitter reaches it by a port-forward through the Kubernetes API (GKE). On the
   local backend the machine's loopback is every local user's, so debugpy gets a
   network of its own, reached through a socket in a private directory
   (:mod:`runner.debug_net`); where the kernel refuses, the job fails in phase
   ``debug``, unless its submitter accepted the machine's loopback (:data:`SHARED_ENV`),
   where the job's log then warns that any local user can attach;
2. writes the *ready marker* ``{job_id}/debug.json`` (port, pid, host index, the
   job's code root, the project's path on the submitting machine, the working
   directory) that ``JobHandle.debug_attach`` waits for;
3. waits until a client has attached and finished its configuration (breakpoints
   are set by then), for at most the spec's ``wait`` seconds. A client that never comes
   ends the job in phase ``debug`` with a message saying so, never a hang.

Then the function runs under the debugger. Standard library only at import;
debugpy is imported when a debug job needs it.
"""

# ruff: noqa: T100 - starting the debugger is this module's purpose
from __future__ import annotations

import atexit
import json
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.protocol import PhaseError
from runner.store import FileStore

if TYPE_CHECKING:
    from collections.abc import Callable

    from runner.protocol import DebugSpec
    from runner.store import RunnerStore

PHASE = "debug"
WAIT_ENV = "KINETIC_DEBUG_WAIT_TIMEOUT"
"""Submitter-side variable: seconds a debug job waits for a client (default 600)."""
DEFAULT_WAIT = 600.0
SHARED_ENV = "KINETIC_DEBUG_SHARED_PORT"
"""Submitter-side variable: ``1`` lets a local debug job whose kernel refuses it a
private network listen on the machine's loopback, where any local user can attach."""
LISTEN_HOST = "127.0.0.1"


def _listen_privately(
    listen: Callable[[], int],
    *,
    shared_port: bool = False,
    refused: str | None = None,
) -> tuple[int, str | None, list[dict[str, int]]]:
    """debugpy in a network of the job's own, behind a private socket
    (:mod:`runner.debug_net`): its port, that socket, and the processes it started there.

    :param shared_port: where the kernel refuses, listen on the machine's loopback,
        with a warning naming the exposure; debugpy's adapter (which daemonizes, and
        would outlive the job) is then found by its listening socket, and ended with
        the job as in a private network.
    :param refused: why the kernel refused the job a user namespace at its start
        (:func:`runner.isolation.refusal`): no private network is tried then.
    :raises PhaseError: (phase ``debug``) where the kernel refuses and ``shared_port``
        is false: the error says why, and how to accept the machine's loopback.
    """
    from runner.debug_net import end_processes, listen_privately, listener_owners

    try:
        if refused is not None:
            raise OSError(f"no user namespace for the job: {refused}")
        isolated = listen_privately(listen)
    except OSError as exc:
        if not shared_port:
            raise PhaseError(
                PHASE,
                f"the debugger could not get a private network ({exc}), and on this "
                f"machine's {LISTEN_HOST} any local user could attach to it and run code "
                "as you. Allow unprivileged user namespaces (sysctl "
                "kernel.unprivileged_userns_clone=1, or the AppArmor setting "
                "kernel.apparmor_restrict_unprivileged_userns=0), debug on GKE, or, on "
                f"a machine only you use, submit with {SHARED_ENV}=1 to accept a shared "
                "port (docs/security.md#debug-mode)",
            ) from exc
        port = listen()
        helpers = listener_owners(LISTEN_HOST, port)
        atexit.register(end_processes, helpers)
        print(
            f"kinetic runner: WARNING: the debugger could not get a private network ({exc}); "
            f"it listens on {LISTEN_HOST}:{port}, where any user of this machine can attach "
            "and run code as you (docs/security.md)",
            file=sys.stderr,
            flush=True,
        )
        return port, None, helpers
    return isolated.port, isolated.socket_path, isolated.helpers


def ready_key(job_id: str) -> str:
    """The ready marker's key: written once debugpy listens."""
    return f"{job_id}/debug.json"


def wait_for_client(
    store: RunnerStore,
    job_id: str,
    spec: DebugSpec,
    fn: Any,
    *,
    code_root: Path,
    host: int | None = None,
) -> None:
    """Start debugpy on loopback, write the ready marker, and wait for a client.

    :param spec: the job spec's ``debug`` entry (seconds to wait, the project's path
        on the submitting machine).
    :param fn: the job's function: its code, shipped by value, is pointed at the job's
        copy of the project (:func:`point_code_at`).
    :param code_root: where the job's project files are (the VS Code ``remoteRoot``).
    :param host: the host index of a multi-host job (None for a single host).
    :raises PhaseError: (phase ``debug``) debugpy is missing or cannot listen, the
        marker cannot be written, or no client attached within the wait.
    """
    from runner.code_files import point_code_at

    wait = float(spec["wait"])
    source_root = str(spec.get("source_root") or "")
    if source_root:
        point_code_at(fn, source_root, str(code_root))
    # pydevd warns about frozen stdlib modules on every start; the advice does not
    # apply to a job's code, which is never frozen.
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    try:
        import debugpy
    except ImportError as exc:
        raise PhaseError(
            PHASE,
            "debug=True needs debugpy in the job's Python environment "
            f"({sys.executable}): Kinetic's images carry it; for a custom image or the "
            "local backend, `pip install debugpy`",
        ) from exc

    def _listen() -> int:
        return int(debugpy.listen((LISTEN_HOST, 0))[1])

    socket_path: str | None = None
    helpers: list[dict[str, int]] = []
    try:
        if isinstance(store, FileStore):  # this machine: other users must not attach
            from runner.isolation import refusal

            port, socket_path, helpers = _listen_privately(
                _listen, shared_port=bool(spec.get("shared_port")), refused=refusal()
            )
        else:  # a pod: its loopback is its own already
            port = _listen()
    except PhaseError:
        raise
    except Exception as exc:  # debugpy raises RuntimeError and OSError alike
        raise PhaseError(PHASE, f"debugpy could not start listening: {exc}") from exc
    marker = {
        "host": LISTEN_HOST,
        "port": int(port),
        "socket": socket_path,
        "helpers": helpers,  # ended with the job; a cancel that kills it ends them
        "pid": os.getpid(),
        "host_index": host,
        "code_root": str(code_root),
        "source_root": source_root,
        "cwd": os.getcwd(),
        "wait_timeout": wait,
    }
    try:
        store.write(ready_key(job_id), json.dumps(marker, sort_keys=True).encode())
    except Exception as exc:  # any storage failure ends the job here
        raise PhaseError(PHASE, f"cannot write the debugger-ready marker: {exc}") from exc
    print(
        f"kinetic runner: job {job_id} waits up to {wait:.0f}s for a debugger on "
        f"{socket_path or f'{LISTEN_HOST}:{port}'} (attach with job.debug_attach())",
        file=sys.stderr,
        flush=True,
    )
    attached = threading.Event()

    def _wait() -> None:
        debugpy.wait_for_client()  # returns after the client's configurationDone
        attached.set()

    # debugpy's wait has no timeout of its own: it waits in a thread, bounded here.
    threading.Thread(target=_wait, name="kinetic-debug-wait", daemon=True).start()
    if not attached.wait(wait):
        debugpy.wait_for_client.cancel()
        raise PhaseError(
            PHASE,
            f"no debugger client attached within {wait:.0f}s (set {WAIT_ENV} on the "
            "submitting side to wait longer); attach with job.debug_attach() while "
            "the job waits",
        )
    print(f"kinetic runner: debugger attached to job {job_id}", file=sys.stderr, flush=True)
