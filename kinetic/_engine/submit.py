"""Submitting one job: validate, package, store, launch — or leave nothing behind.

Order matters. Everything that can be checked without side effects is checked
first (settings, accelerator, pickling), so bad input fails before any object
is written. The caller's loop never runs the blocking steps: they are grouped into
few worker-thread calls (settings and paths; pickling, hashing and the context's
stat walk), bounded per loop by :func:`kinetic._engine.runtime.blocking_limiter`. The
backend is asked what differs (:meth:`~kinetic._backends.base.Backend.placement`,
``get_ready`` and ``prepare_launch``), and the job's image is resolved here
(:func:`job_image`), both before anything is written. Then the shared context archive
(content-addressed, stored once), the payload, the spec and the handle are written, and
the backend launches the job. If anything fails after the first job object was
written, the job's objects are deleted again under a cancellation shield, and the error
re-raised.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from kinetic import _log
from kinetic._backends.base import Backend, NewJob
from kinetic._core import accelerators
from kinetic._core.config import Settings, capture_env
from kinetic._core.ids import new_job_id
from kinetic._core.image_spec import JobImage, execution_mode
from kinetic._core.records import job_names, job_spec, shared_handle
from kinetic._core.retries import Retries, retries_record
from kinetic._core.secret_spec import Secret, check_volume_overlap
from kinetic._core.secret_spec import records as secret_records
from kinetic._engine import runtime
from kinetic._engine.captured_env import capture_job_env
from kinetic._engine.data_refs import holds_data, prepare_data
from kinetic._engine.handle import JobHandle
from kinetic._engine.interpreter_checks import warn_missing_requirements, warn_missing_runtime
from kinetic._engine.packaging import (
    ContextArchive,
    astore_archive,
    context_archive,
    find_package_root,
    function_source_dir,
    pickle_payload,
    relative_sys_path,
)
from kinetic._engine.preload import import_backend_code
from kinetic._exceptions import ConfigError, DataError
from kinetic._settings import load_settings
from kinetic._storage.base import Storage
from runner import protocol

GKE_DEFAULT_ACCELERATOR = "tpu-v5e-1"
"""The original's default accelerator, used on GKE when none is given."""

log = logging.getLogger(__name__)


async def undo_submission(storage: Storage, prefix: str, first: str | None = None) -> None:
    """Delete what a failed submission wrote under ``prefix`` (``first`` before the rest:
    the record that makes it visible). Call it shielded, from the ``except`` block that
    re-raises why the submission failed: a failure to delete is logged, never raised
    over that reason."""
    try:
        if first is not None:
            await storage.delete(first)
        await storage.delete_prefix(prefix)
    except Exception as exc:  # noqa: BLE001 - the submission's own error is what matters
        log.warning("could not delete %s after a failed submission: %s", prefix, exc)


@dataclass(frozen=True)
class RunOptions:
    """The arguments of ``@kinetic.run``, validated once at decoration time."""

    accelerator: str | None = None
    container_image: str | None = None
    base_image_repo: str | None = None
    zone: str | None = None
    project: str | None = None
    capture_env_vars: tuple[str, ...] | None = None
    cluster: str | None = None
    backend: str | None = None
    namespace: str | None = None
    volumes: Mapping[str, Any] | None = field(default=None, hash=False)
    spot: bool = False
    output_dir: str | None = None
    debug: bool = False
    secrets: tuple[Secret, ...] = ()
    timeout: float | None = None
    """The run-time limit of the function, in seconds (:mod:`runner.time_limit`)."""
    retries: Retries | None = None
    """How the job's runner retries the function (:mod:`kinetic._core.retries`)."""

    def __post_init__(self) -> None:
        if self.accelerator is not None:
            accelerators.parse_accelerator(self.accelerator, spot=self.spot)
        if self.backend is not None and self.backend not in ("local", "gke", "pathways"):
            raise ConfigError(
                f"unknown backend {self.backend!r}; valid backends: 'local', 'gke', 'pathways'"
            )
        capture_env(list(self.capture_env_vars or ()), {})
        execution_mode(self.container_image)
        if self.output_dir is not None and not _absolute_location(self.output_dir):
            raise ConfigError(
                f"output_dir must be an absolute path or a gs:// URI, got {self.output_dir!r} "
                "(a relative path would mean a different place in the job than here)"
            )
        if self.volumes is not None:
            _check_volumes(self.volumes)
            check_volume_overlap(self.secrets, self.volumes)


async def check_local_secrets(secrets: tuple[Secret, ...]) -> None:
    """Resolve a local job's secrets as its runner will (:mod:`runner.secrets`), and drop
    the values: one missing here fails the submission, before anything is written.

    :raises ConfigError: naming the secret, and what to do.
    """
    from runner.secrets import SecretError, resolve

    try:
        await anyio.to_thread.run_sync(resolve, secret_records(secrets), dict(os.environ))
    except SecretError as exc:
        raise ConfigError(str(exc)) from None


def _absolute_location(path: object) -> bool:
    return isinstance(path, str) and (path.startswith("gs://") or os.path.isabs(path))


def _check_volumes(volumes: Mapping[str, Any]) -> None:
    from kinetic._data.data import Data
    from kinetic._engine.data_refs import check_mount_path

    if not isinstance(volumes, Mapping):
        raise DataError(
            f"volumes must be a dict of mount path -> Data, got {type(volumes).__name__}"
        )
    for mount, value in volumes.items():
        check_mount_path(mount)
        if not isinstance(value, Data):
            raise DataError(f"volume {mount!r} must be a kinetic.Data, got {type(value).__name__}")


_NOTICE_LOCK = threading.Lock()
_notice_shown = False


def _local_notice(settings: Settings) -> None:
    """Say once per process, at INFO, that jobs go to the local backend by default (not
    marked said while the level hides it: an application that lowers it later hears it)."""
    global _notice_shown
    with _NOTICE_LOCK:
        if _notice_shown or not log.isEnabledFor(logging.INFO):
            return
        _notice_shown = True
    log.info(
        "no GCP project configured; running on the local backend (%s). "
        "Set KINETIC_PROJECT or pass backend= to choose.",
        settings.local_root,
    )


def target_settings(opts: RunOptions) -> tuple[Settings, accelerators.AcceleratorConfig]:
    """Settings and accelerator for a new job, with the code of its backend imported
    (:mod:`kinetic._engine.preload`). Blocking (reads the profiles file, imports).

    :raises ConfigError: (and subclasses) for unknown backends, malformed profiles,
        and accelerators the backend cannot provide.
    """
    _log.apply_env()  # KINETIC_LOG_LEVEL / KINETIC_QUIET, set after `import kinetic` too
    settings = load_settings(
        backend=opts.backend,
        project=opts.project,
        zone=opts.zone,
        cluster=opts.cluster,
        namespace=opts.namespace,
        base_image_repo=opts.base_image_repo,
    )
    default = "cpu" if settings.backend == "local" else GKE_DEFAULT_ACCELERATOR
    accel = accelerators.parse_accelerator(opts.accelerator or default, spot=opts.spot)
    if settings.backend == "local":
        from kinetic._backends import local_gpus  # only for local jobs: keeps `import kinetic` fast

        # This machine's GPUs, or TPU code on CPUs by opt-in; refused before anything is written.
        local_gpus.admit(accel, requested=opts.accelerator, settings=settings)
    else:
        from dataclasses import replace

        from kinetic._core.lws_spec import choose_backend

        # Multi-host TPU slices go to pathways unless a backend was asked for.
        explicit = bool(opts.backend or os.environ.get("KINETIC_BACKEND"))
        chosen = choose_backend(settings.backend, accel, explicit=explicit)
        if chosen != settings.backend:
            settings = replace(settings, backend=chosen)
    import_backend_code(settings.backend)  # here, in a worker thread, not on the loop
    if settings.backend != "local":
        from kinetic._engine.cluster_check import check_cluster_choice

        check_cluster_choice(settings)  # reads the kubeconfig: here, in a worker thread
    if settings.backend == "local":  # before anything is written there (docs/security.md)
        from kinetic._storage.local import check_root

        check_root(Path(settings.local_root).absolute())
    return settings, accel


def _on_node_network(backend: Backend) -> bool:
    """Whether the backend's pods share their node's network (``hostNetwork``)."""
    options = getattr(backend, "options", None)  # a cluster backend's (GKEOptions)
    pod = getattr(options, "pod", None)
    return bool(getattr(pod, "host_network", False))


def _backend_for(settings: Settings) -> Backend:
    backend = runtime.backend_for_settings(settings)
    if settings.backend_was_defaulted:
        _local_notice(settings)
    return backend


def resolve_target(opts: RunOptions) -> tuple[Settings, accelerators.AcceleratorConfig, Backend]:
    """Settings, accelerator and backend for a new job. Blocking: on a loop, use
    :func:`aresolve_target`.

    :raises ConfigError: as :func:`target_settings`.
    """
    settings, accel = target_settings(opts)
    return settings, accel, _backend_for(settings)


async def aresolve_target(
    opts: RunOptions,
) -> tuple[Settings, accelerators.AcceleratorConfig, Backend]:
    """:func:`resolve_target` with its file reads in a worker thread (the backend, which
    belongs to the running loop, is looked up on it)."""
    settings, accel = await anyio.to_thread.run_sync(
        target_settings, opts, limiter=runtime.blocking_limiter()
    )
    return settings, accel, _backend_for(settings)


@dataclass(frozen=True)
class _Located:
    """Where the call comes from: settings, and the project that travels with it."""

    settings: Settings
    accel: accelerators.AcceleratorConfig
    root: Path
    sys_path: list[str]
    cwd: str | None


def _locate(opts: RunOptions, fn: Callable[..., Any]) -> _Located:
    """Settings, package root and import paths of a call. Blocking: stats and a file read."""
    settings, accel = target_settings(opts)
    root = find_package_root(function_source_dir(fn))
    sys_path, cwd = relative_sys_path(root, Path.cwd())
    return _Located(settings, accel, root, sys_path, cwd)


@dataclass(frozen=True)
class _Packed:
    """The call's payload and its SHA-256, and the project's archive (maybe not stored)."""

    payload: bytes
    payload_sha256: str
    archive: ContextArchive


def _pack(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    root: Path,
    volumes: list[Any] | None,
    exclude: tuple[Path, ...],
) -> _Packed:
    """Pickle the call, hash it, and find the project's archive. Blocking: CPU and stats."""
    payload = pickle_payload(fn, args, kwargs, root, volumes=volumes)
    archive = context_archive(root, exclude=exclude)
    return _Packed(payload, hashlib.sha256(payload).hexdigest(), archive)


def _pack_plain(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    root: Path,
    exclude: tuple[Path, ...],
) -> _Packed | None:
    """:func:`_pack` for a call without ``kinetic.Data``; None when it holds some (their
    uploads come first). Blocking.

    :raises DataError: for a ``Data`` where it cannot be replaced (a set, a dict key).
    """
    if holds_data(args, kwargs):
        return None
    return _pack(fn, args, kwargs, root, None, exclude)


async def job_image(
    backend: Backend,
    settings: Settings,
    accelerator: accelerators.AcceleratorConfig,
    container_image: str | None,
    package_root: Path,
) -> JobImage:
    """The image a job or a batch runs in, in its execution mode (bundled images are
    built and pushed here when new); on a backend whose jobs run here, none (this
    interpreter is checked for the project's requirements and, for a GPU or TPU job,
    the runtime its image would carry, each said once instead). Nothing about the
    job is written. Call :meth:`~kinetic._backends.base.Backend.get_ready` first.

    :raises RequirementsError, RuntimeConflictError, ConfigError, ImageBuildError,
        BackendError: see :func:`kinetic._images.modes.resolve_job_image`.
    """
    images = backend.placement(settings).images
    if images is None:
        await warn_missing_requirements(package_root)
        # A pod would have its image's runtime; this interpreter may not. Here, so that a
        # single job and a batch say it alike.
        await warn_missing_runtime(accelerator.kind)
        return JobImage(container_image or "", "local")
    from kinetic._engine.requirements_io import read_project_requirements
    from kinetic._images.modes import resolve_job_image

    requirements = (
        []  # a custom image brings its own: the project's files are not read
        if execution_mode(container_image) == "custom"
        else await anyio.to_thread.run_sync(read_project_requirements, package_root)
    )
    return await resolve_job_image(
        container_image,
        requirements=requirements,
        category=accelerator.kind,
        settings=settings,
        options=images,
        storage=backend.storage,
        env=os.environ,
        progress=_build_progress,
    )


def _build_progress(line: str) -> None:
    # A build takes minutes: say that it runs and show its steps, not every line of pip.
    if line.startswith(("building ", "Step ")):
        log.info("%s", line)


async def submit(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    opts: RunOptions,
) -> JobHandle:
    """Submit one call of ``fn`` as a job and return its handle once it is launched.

    Every blocking step (profile read, stats, pickling, hashing, zipping, file writes,
    the process launch) runs in a worker thread; what stays on the loop is bookkeeping
    of a few microseconds per step, so many submissions at once keep the loop responsive.

    :raises ConfigError: for invalid settings (nothing is written).
    :raises SerializationError: when the function or an argument cannot be pickled
        (nothing is written).
    :raises StorageError, BackendError: when storing or launching fails; the job's
        objects are removed again.
    """
    limiter = runtime.blocking_limiter()
    where = await anyio.to_thread.run_sync(_locate, opts, fn, limiter=limiter)
    settings, accel, root = where.settings, where.accel, where.root
    backend = _backend_for(settings)
    env = capture_job_env(list(opts.capture_env_vars or ()), os.environ)
    # How debug jobs wait for a debugger (runner/debug.py): checked before any write.
    debug_spec: protocol.DebugSpec | None = None
    if opts.debug:
        from kinetic._core.debug import shared_port, wait_timeout  # keeps imports light

        debug_spec = {"wait": wait_timeout(os.environ), "source_root": str(root)}
        if shared_port(os.environ):
            debug_spec["shared_port"] = True
        elif _on_node_network(backend):
            raise ConfigError(
                "debug=True in a pod on the node's network (KINETIC_GKE_HOST_NETWORK): "
                "debugpy would listen on the node's loopback, where any process on the "
                "node can attach and run code as the job. Debug on a cluster with pod "
                "networking, or set KINETIC_DEBUG_SHARED_PORT=1 to accept a shared port "
                "(a test cluster without a CNI)"
            )
    if opts.retries is not None and settings.backend == "pathways":
        raise ConfigError(
            "retries= is for single-host jobs: a multi-host (pathways) job's hosts run "
            "in step, and one cannot run its part again alone"
        )
    job_id = new_job_id()
    storage = backend.storage
    func_name = getattr(fn, "__name__", type(fn).__name__)
    # The backend's checks, the image and the launch's plan: before anything is written.
    await backend.get_ready()
    place = backend.placement(settings)
    output_dir = opts.output_dir or place.output_dir(job_id)
    image = await job_image(backend, settings, accel, opts.container_image, root)
    if opts.secrets and place.runs_here:  # before anything is written
        await check_local_secrets(opts.secrets)
    launch = backend.prepare_launch(
        NewJob(
            job_id=job_id,
            namespace=settings.namespace,
            image=image.uri,
            accelerator=accel,
            output_dir=output_dir,
            env=env,
            func_name=func_name,
            runner_image=image.runner,
            secrets=() if place.runs_here else opts.secrets,
            timeout=opts.timeout,
            retries=opts.retries.count if opts.retries is not None else 0,
        )
    )
    # The local root holds jobs' records and contexts: never part of a context.
    excluded: tuple[Path, ...] = (Path(settings.local_root),)
    has_data = False
    packed = None
    if opts.volumes is None:
        packed = await anyio.to_thread.run_sync(
            _pack_plain, fn, args, kwargs, root, excluded, limiter=limiter
        )
    if packed is None:
        data = await prepare_data(
            args,
            kwargs,
            opts.volumes,
            storage=backend.storage,
            local_backend=place.runs_here,
        )
        if data.fuse_buckets:
            launch = launch.with_gcs_fuse(data.fuse_buckets)
        has_data = data.has_data
        excluded = (*excluded, *data.local_paths)
        packed = await anyio.to_thread.run_sync(
            _pack, fn, data.args, data.kwargs, root, data.volumes, excluded, limiter=limiter
        )
    # Content-addressed and shared: stored before the job's own objects, and kept.
    archive = await astore_archive(storage, packed.archive, exclude=excluded)

    spec = job_spec(
        job_id=job_id,
        func_name=func_name,
        payload_sha256=packed.payload_sha256,
        context_sha256=archive.sha256,
        cwd=where.cwd,
        sys_path=where.sys_path,
        env=env,
        output_dir=output_dir,
        has_data=has_data,
        install=image.install,
        install_kept=image.install_kept,
    )
    if opts.volumes and place.runs_here:
        spec["private_volumes"] = True
    if opts.secrets and place.runs_here:  # the runner resolves them here; a pod's, Kubernetes
        spec["secrets"] = secret_records(opts.secrets)
    if debug_spec is not None:
        spec["debug"] = debug_spec
    if opts.timeout is not None:  # the runner enforces it, wherever the job runs
        spec["timeout"] = opts.timeout
    if opts.retries is not None:  # the runner retries, in the job's process
        spec["retries"] = retries_record(opts.retries)
    handle = JobHandle(
        **shared_handle(
            backend=backend.name,
            project=settings.project or "",
            bucket_name=place.bucket_name,
            cluster_name=place.cluster_name,
            zone=place.zone,
            namespace=settings.namespace,
            image_uri=image.uri,
            accelerator=accel.name + (":spot" if accel.spot else ""),
            func_name=func_name,
            debug=opts.debug,
        ),
        job_id=job_id,
        **job_names(job_id, func_name),
    )
    objects = {
        protocol.payload_key(job_id): packed.payload,
        protocol.spec_key(job_id): protocol.dump_json(spec),
        protocol.handle_key(job_id): protocol.dump_json(handle.to_dict()),
    }
    try:
        # Independent objects: written at once (the launch needs them all).
        await storage.write_many(objects)
        await launch.start(handle)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await undo_submission(storage, f"{job_id}/", protocol.handle_key(job_id))
        raise
    return handle
