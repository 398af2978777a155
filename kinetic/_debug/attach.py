"""``JobHandle.debug_attach``: wait for a debug job's debugger, forward it, say how to attach.

Sequence: check the handle (a ``debug=True`` job, not a batch input); wait for the
job's ready marker (``{job_id}/debug.json``, written by :mod:`runner.debug` once
debugpy listens), reading it every :data:`POLL` seconds and the job's status every
:data:`STATUS_EVERY` polls, so that a job that ended or failed before it was ready is
reported at once; then start a :class:`~kinetic._debug.forward.DebugForward` to the
job's port (directly on this machine for the local backend; through the Kubernetes
API's port-forward to the job's running pod on GKE), and print the VS Code launch
configuration that attaches through it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from kinetic._backends.base import Backend
from kinetic._core import k8s_spec, k8s_status
from kinetic._core.debug import ReadyMarker, launch_configuration, parse_marker
from kinetic._core.status import JobStatus
from kinetic._debug.forward import DebugForward, ForwardLoop, LocalUpstream, Upstream
from kinetic._exceptions import (
    BackendError,
    ConfigError,
    JobFailedError,
    JobTimeoutError,
    ObjectNotFoundError,
    ResultError,
)
from runner.debug import ready_key

if TYPE_CHECKING:
    from kinetic._engine.handle import JobHandle

logger = logging.getLogger(__name__)

POLL = 0.5
STATUS_EVERY = 4


async def debug_attach(
    job: JobHandle,
    backend: Backend,
    *,
    local_port: int,
    working_dir: str | None,
    timeout: float | None,
) -> DebugForward:
    """See :meth:`kinetic.aio.JobHandle.debug_attach`."""
    if not job.debug:
        raise ConfigError(
            f"job {job.job_id} was not submitted with debug=True: it does not wait for a "
            "debugger (use @kinetic.run(debug=True))"
        )
    if job.group_id is not None:
        raise ConfigError(
            f"job {job.job_id} is an input of batch {job.group_id}: batch inputs do not "
            "wait for a debugger; debug one call with fn.run_async() instead"
        )
    if not isinstance(local_port, int) or not 0 <= local_port <= 65535:
        raise ConfigError(f"local_port must be a port number 0-65535 (got {local_port!r})")
    if timeout is not None and timeout <= 0:
        raise ConfigError(f"timeout must be > 0 seconds or None (got {timeout!r})")

    marker = await _wait_ready(job, backend, timeout)
    upstream: Upstream
    if backend.name == "local":
        upstream = LocalUpstream(marker.port, socket_path=marker.socket)
        if marker.socket is None:
            _warn_shared(job.job_id, f"this machine's 127.0.0.1:{marker.port}")
    else:
        upstream = await _pod_upstream(job, backend, marker)
    # The project as the submitting machine has it, unless told where it is here.
    local_root = marker.source_root or None
    if working_dir is not None:
        local_root = await anyio.to_thread.run_sync(os.path.abspath, working_dir)
    loop = ForwardLoop(upstream, local_port)
    try:
        await anyio.to_thread.run_sync(loop.start)
    except BaseException:
        # Cancelled while it started (or it failed): it must not keep serving unowned.
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(loop.stop)
        raise
    config = launch_configuration(
        job.job_id, loop.port, local_root=local_root, remote_root=marker.code_root
    )
    forward = DebugForward(job.job_id, loop.port, upstream.describe(), config, loop)
    _announce(forward, marker)
    return forward


async def _wait_ready(job: JobHandle, backend: Backend, timeout: float | None) -> ReadyMarker:
    key = ready_key(job.job_id)
    with anyio.move_on_after(timeout):
        polls = 0
        while True:
            if polls % STATUS_EVERY == 0:
                await _check_alive(job, backend)
            try:
                data = await backend.storage.read(key)
            except ObjectNotFoundError:
                pass
            else:
                # A marker of a job that has ended since (it timed out waiting, say)
                # must not be forwarded to.
                await _check_alive(job, backend)
                try:
                    return parse_marker(data)
                except ValueError as exc:
                    raise ResultError(
                        f"the debugger-ready marker of job {job.job_id} is corrupted: {exc}",
                        job_id=job.job_id,
                    ) from exc
            polls += 1
            await anyio.sleep(POLL)
    raise JobTimeoutError(
        f"job {job.job_id} did not start its debugger within {timeout}s (it may still be "
        "pending: see job.status_report()); the job keeps running"
    )


async def _check_alive(job: JobHandle, backend: Backend) -> None:
    report = await backend.status(job)
    if not report.status.is_terminal:
        return
    if report.status is JobStatus.FAILED:
        raise JobFailedError(
            f"job {job.job_id} ended before a debugger attached: {report.reason}",
            job_id=job.job_id,
            phase=report.phase,
        )
    raise ConfigError(
        f"job {job.job_id} has already ended ({report.status.value}): nothing to debug"
    )


async def _pod_upstream(job: JobHandle, backend: Backend, marker: ReadyMarker) -> Upstream:
    """The port-forward to the running pod that wrote the marker (host 0's, for a
    multi-host job)."""
    from kinetic._backends.gke.client import KubeClient
    from kinetic._backends.gke.portforward import PodPortForward

    client = getattr(backend, "client", None)
    if not isinstance(client, KubeClient):
        raise ConfigError(f"debug_attach does not support the {backend.name!r} backend")
    pods = await client.list_objects("pods", job.namespace, k8s_spec.job_selector(job.job_id))
    running = [p for p in pods.get("items") or [] if _phase(p) == "Running"]
    if marker.host_index is not None:
        from kinetic._core import lws_spec

        leader = lws_spec.pod_name(job.job_id, marker.host_index)
        running = [p for p in running if p["metadata"]["name"] == leader] or running
    if not running:
        raise BackendError(
            f"job {job.job_id} has no running pod in namespace {job.namespace} to forward to"
        )
    pod = max(running, key=lambda p: str(p["metadata"].get("creationTimestamp") or ""))
    if (pod.get("spec") or {}).get("hostNetwork"):
        _warn_shared(job.job_id, f"the loopback of node {pod['spec'].get('nodeName') or '?'}")
    # The forward runs on a loop of its own: it gets its own copy of the credentials.
    credentials = await client.credentials_for_another_loop()
    return PodPortForward(credentials, job.namespace, pod["metadata"]["name"], marker.port)


def _phase(pod: dict[str, Any]) -> str | None:
    if k8s_status.pod_finished(pod):
        return None
    status = pod.get("status") or {}
    phase = status.get("phase")
    return phase if isinstance(phase, str) else None


def _warn_shared(job_id: str, where: str) -> None:
    """Say that a debug session is not private: its debugger listens on ``where``,
    which other users (of the machine, or of the node) share."""
    logger.warning(
        "the debugger of job %s is not private: it listens on %s, where any "
        "other user there can attach and run code as you (docs/security.md#debug-mode)",
        job_id,
        where,
    )


def _announce(forward: DebugForward, marker: ReadyMarker) -> None:
    print(
        f"kinetic: the debugger of job {forward.job_id} is forwarded to "
        f"127.0.0.1:{forward.local_port} (from {forward.target}); the job waits for a "
        f"client for {marker.wait_timeout:.0f}s from its start. VS Code launch configuration:\n"
        + json.dumps(forward.launch_config, indent=2),
        file=sys.stdout,
        flush=True,
    )
