"""Backends in use by this process, one set per event loop.

Network clients (aiohttp sessions, Kubernetes API clients, watches) belong to
the loop that created them, so the registry is keyed by the running loop; the
sync facade's private loop and a user's own loop each get their own. So is the
limiter of blocking submission work (:func:`blocking_limiter`).

They are closed when their loop ends: ``asyncio.run`` (and ``anyio.run``, and
``asyncio.Runner``) close the async generators still suspended on a loop before
closing it (``loop.shutdown_asyncgens()``), and a generator parked at its first
``yield`` is the one hook asyncio offers a library there (see :func:`_close_at_loop_end`).
Without it each ``asyncio.run`` that used the GKE backend kept its loop, its clients
and their sockets until the process ended. The sync facade closes its own loop's
backends at exit (:func:`aclose_backends`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import weakref
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from kinetic._backends.base import Backend
from kinetic._backends.local import LocalBackend
from kinetic._core.config import Settings
from kinetic._core.kube_context import OVERRIDE_ENV, gke_context_name
from kinetic._exceptions import ConfigError
from kinetic._storage.trust import trust_settings

if TYPE_CHECKING:
    from kinetic._backends.gke.backend import GKEBackend
    from kinetic._backends.pathways.backend import PathwaysBackend

_REGISTRIES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, ...], Backend]]
_REGISTRIES = weakref.WeakKeyDictionary()


def _registry() -> dict[tuple[str, ...], Backend]:
    loop = asyncio.get_running_loop()
    registry = _REGISTRIES.get(loop)
    if registry is None:
        registry = _REGISTRIES[loop] = {}
        _close_at_loop_end(loop)
    return registry


_CLOSERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncGenerator[None, None]]
_CLOSERS = weakref.WeakKeyDictionary()


def _close_at_loop_end(loop: asyncio.AbstractEventLoop) -> None:
    """Have ``loop``'s ``shutdown_asyncgens()`` close its backends (module docstring).

    The closer is started here, without awaiting: its first step only registers it
    with the loop (the loop's ``firstiter`` hook) and stops at its ``yield``. Its
    finalizer is a no-op of ours, not the loop's: a loop closed without
    ``shutdown_asyncgens()`` can close nothing any more, and the loop's finalizer
    would then fail at exit scheduling work on it.
    """
    if loop in _CLOSERS:
        return
    closer = _closer()
    hooks = sys.get_asyncgen_hooks()
    sys.set_asyncgen_hooks(firstiter=hooks.firstiter, finalizer=_leave_unclosed)
    try:
        first = closer.asend(None)
    finally:
        sys.set_asyncgen_hooks(*hooks)
    try:
        first.send(None)
    except StopIteration:
        _CLOSERS[loop] = closer  # parked at its yield; the loop holds it only weakly


def _leave_unclosed(closer: AsyncGenerator[None, None]) -> None:
    """The finalizer of a closer whose loop ended without closing it: nothing to do."""


async def _closer() -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        await _close_backends()


# Blocking steps of submissions (pickling, hashing, stat walks, profile reads) running at
# once. More threads would not finish sooner (the work holds the GIL, and the cores are
# few): they would only make the loop's thread wait longer for the GIL between steps.
BLOCKING_CONCURRENCY = 4
_LIMITERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, anyio.CapacityLimiter]
_LIMITERS = weakref.WeakKeyDictionary()


def blocking_limiter() -> anyio.CapacityLimiter:
    """This loop's limiter for the CPU-bound, blocking steps of submissions.

    Pass it to ``anyio.to_thread.run_sync(..., limiter=)``: a hundred submissions
    started together then queue on it instead of filling anyio's forty threads.
    """
    loop = asyncio.get_running_loop()
    limiter = _LIMITERS.get(loop)
    if limiter is None:
        limiter = _LIMITERS[loop] = anyio.CapacityLimiter(BLOCKING_CONCURRENCY)
    return limiter


def local_backend(root: str | Path) -> LocalBackend:
    """The local backend rooted at ``root`` (``KINETIC_LOCAL_ROOT``)."""
    key = ("local", str(Path(root).absolute()))
    registry = _registry()
    backend = registry.get(key)
    if backend is None:
        backend = registry[key] = LocalBackend(Path(root))
    assert isinstance(backend, LocalBackend)
    return backend


def backend_for_settings(settings: Settings) -> Backend:
    """The backend a new job with these settings runs on.

    :raises ConfigError: when that backend is not available in this build.
    """
    if settings.backend == "local":
        return local_backend(settings.local_root)
    trust_settings(settings)  # this process chose them: its jobs bucket
    context = gke_context_name(settings.project, settings.zone, settings.cluster)
    if settings.backend == "gke":
        return gke_backend(settings.bucket_name, settings.namespace, context)
    if settings.backend == "pathways":
        return pathways_backend(settings.bucket_name, settings.namespace, context)
    raise ConfigError(f"backend {settings.backend!r} is not available yet; use backend='local'")


def backend_for_location(
    backend: str,
    bucket_name: str,
    namespace: str,
    *,
    project: str | None = None,
    zone: str | None = None,
    cluster: str | None = None,
) -> Backend:
    """The backend that owns a job recorded with these handle fields (its cluster is the
    kubeconfig context of ``project``/``zone``/``cluster``, see :mod:`kinetic._core.kube_context`)."""
    if backend == "local":
        # A local job's bucket_name is its storage directory: the root is its parent.
        return local_backend(Path(bucket_name).parent)
    context = gke_context_name(project, zone, cluster)
    if backend == "gke":
        return gke_backend(bucket_name, namespace, context)
    if backend == "pathways":
        return pathways_backend(bucket_name, namespace, context)
    raise ConfigError(f"backend {backend!r} is not available yet")


# One Kubernetes client (and its shared watches) per loop and cluster, for every GKE backend.
_CLUSTERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str | None, Any]]
_CLUSTERS = weakref.WeakKeyDictionary()


def _cluster(context: str | None, options: Any) -> Any:
    """This loop's client of the cluster whose kubeconfig context is ``context``."""
    from kinetic._backends.cluster import Cluster
    from kinetic._backends.gke.client import KubeClient

    loop = asyncio.get_running_loop()
    clusters = _CLUSTERS.setdefault(loop, {})
    _close_at_loop_end(loop)
    override = os.environ.get(OVERRIDE_ENV) or None
    key = override or context
    cluster = clusters.get(key)
    if cluster is None:
        client = KubeClient(
            cluster_context=context,
            context_override=override,
            qps=options.qps,
            burst=options.burst,
        )
        cluster = clusters[key] = Cluster(client)
    return cluster


def gke_backend(bucket: str, namespace: str, context: str | None = None) -> GKEBackend:
    """The GKE backend on ``bucket`` for this loop (its configuration loads on first use).

    Knobs come from ``KINETIC_GKE_*`` / ``KINETIC_K8S_*`` variables
    (:mod:`kinetic._core.gke_config`).

    :raises ConfigError: on a malformed knob or bucket name.
    """
    from kinetic._backends.gke.backend import GKEBackend
    from kinetic._core.gke_config import options_from_env

    options = options_from_env(os.environ)
    key = ("gke", bucket, namespace, repr(options), _context_key(context))
    registry = _registry()
    backend = registry.get(key)
    if backend is None:
        cluster = _cluster(context, options)
        backend = registry[key] = GKEBackend(bucket, cluster, namespace=namespace, options=options)
    assert isinstance(backend, GKEBackend)
    return backend


def pathways_backend(bucket: str, namespace: str, context: str | None = None) -> PathwaysBackend:
    """The pathways backend on ``bucket`` for this loop: the GKE backend's knobs, and
    the same Kubernetes client and shared watches.

    :raises ConfigError: on a malformed knob or bucket name.
    """
    from kinetic._backends.pathways.backend import PathwaysBackend
    from kinetic._core.gke_config import options_from_env

    options = options_from_env(os.environ)
    key = ("pathways", bucket, namespace, repr(options), _context_key(context))
    registry = _registry()
    backend = registry.get(key)
    if backend is None:
        cluster = _cluster(context, options)
        backend = registry[key] = PathwaysBackend(
            bucket, cluster, namespace=namespace, options=options
        )
    assert isinstance(backend, PathwaysBackend)
    return backend


def _context_key(context: str | None) -> str:
    return os.environ.get(OVERRIDE_ENV) or context or ""


async def aclose_backends() -> None:
    """Close the backends (connections, sessions) of the running loop now, rather than
    when it ends. Idempotent."""
    closer = _CLOSERS.pop(asyncio.get_running_loop(), None)
    if closer is not None:
        await closer.aclose()  # runs _close_backends
    else:
        await _close_backends()


async def _close_backends() -> None:
    loop = asyncio.get_running_loop()
    _CLOSERS.pop(loop, None)
    backends = list(_REGISTRIES.pop(loop, {}).values())
    clusters = _CLUSTERS.pop(loop, {})
    for backend in backends:
        with contextlib.suppress(Exception):  # closing one must not keep the others open
            await backend.aclose()
    for cluster in clusters.values():
        with contextlib.suppress(Exception):
            await cluster.aclose()
