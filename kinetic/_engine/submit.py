"""Submitting one job: validate, package, store, launch — or leave nothing behind.

Order matters. Everything that can be checked without side effects is checked
first (settings, accelerator, pickling), so bad input fails before any object
is written. Then the shared context archive (content-addressed, stored once),
the payload, the spec and the handle are written, and the backend launches the
job. If anything fails after the first job object was written, the job's
objects are deleted again under a cancellation shield, and the error re-raised.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from kinetic._backends.base import Backend
from kinetic._core import accelerators
from kinetic._core.config import Settings, capture_env
from kinetic._core.ids import new_job_id
from kinetic._core.image_spec import execution_mode
from kinetic._core.records import utcnow_iso
from kinetic._engine import runtime, targets
from kinetic._engine.data_refs import prepare_data
from kinetic._engine.handle import JobHandle
from kinetic._engine.packaging import (
    apickle_payload,
    astore_context,
    find_package_root,
    function_source_dir,
    relative_sys_path,
)
from kinetic._exceptions import AcceleratorError, ConfigError, DataError
from kinetic._settings import load_settings
from runner import protocol

GKE_DEFAULT_ACCELERATOR = "tpu-v5e-1"
"""The original's default accelerator, used on GKE when none is given."""


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

    def __post_init__(self) -> None:
        if self.accelerator is not None:
            accelerators.parse_accelerator(self.accelerator, spot=self.spot)
        if self.backend is not None and self.backend not in ("local", "gke", "pathways"):
            raise ConfigError(
                f"unknown backend {self.backend!r}; valid backends: 'local', 'gke', 'pathways'"
            )
        capture_env(list(self.capture_env_vars or ()), {})
        execution_mode(self.container_image)
        if self.volumes is not None:
            _check_volumes(self.volumes)


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
    global _notice_shown
    with _NOTICE_LOCK:
        if _notice_shown or os.environ.get("KINETIC_QUIET"):
            return
        _notice_shown = True
    print(
        "kinetic: no GCP project configured; running on the local backend "
        f"({settings.local_root}). Set KINETIC_PROJECT or pass backend= to choose.",
        file=sys.stderr,
    )


def resolve_target(opts: RunOptions) -> tuple[Settings, accelerators.AcceleratorConfig, Backend]:
    """Settings, accelerator and backend for a new job.

    :raises ConfigError: (and subclasses) for unknown backends, malformed profiles,
        and accelerators the backend cannot provide.
    """
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
    if settings.backend == "local" and not accelerators.local_supported(accel):
        raise AcceleratorError(
            f"the local backend cannot provide accelerator {accel.name!r}: it runs jobs on this "
            "machine's CPUs; use accelerator='cpu', or a GKE backend (set KINETIC_PROJECT)"
        )
    backend = runtime.backend_for_settings(settings)
    if settings.backend_was_defaulted:
        _local_notice(settings)
    return settings, accel, backend


async def submit(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    opts: RunOptions,
) -> JobHandle:
    """Submit one call of ``fn`` as a job and return its handle once it is launched.

    :raises ConfigError: for invalid settings (nothing is written).
    :raises SerializationError: when the function or an argument cannot be pickled
        (nothing is written).
    :raises StorageError, BackendError: when storing or launching fails; the job's
        objects are removed again.
    """
    settings, accel, backend = resolve_target(opts)
    env = capture_env(list(opts.capture_env_vars or ()), os.environ)
    job_id = new_job_id()
    storage = backend.storage
    target = targets.target_for(backend)
    place = target.placement(settings, job_id, opts.output_dir)
    output_dir = place.output_dir
    func_name = getattr(fn, "__name__", type(fn).__name__)
    root = find_package_root(function_source_dir(fn))
    # Backend-specific checks and image resolution: before anything is written.
    image = await target.prepare(
        backend,
        targets.LaunchInput(
            job_id=job_id,
            settings=settings,
            accelerator=accel,
            container_image=opts.container_image,
            output_dir=output_dir,
            env=env,
            func_name=func_name,
            package_root=root,
        ),
    )
    try:
        data = await prepare_data(
            args,
            kwargs,
            opts.volumes,
            storage=backend.storage,
            local_backend=backend.name == "local",
        )
        if data.fuse_buckets:
            target.mount_gcs_fuse(backend, job_id, data.fuse_buckets)
        payload = await apickle_payload(fn, data.args, data.kwargs, root, volumes=data.volumes)
        # Content-addressed and shared: stored before the job's own objects, and kept.
        archive = await astore_context(
            storage, root, exclude=(Path(settings.local_root), *data.local_paths)
        )
        sys_path, cwd = relative_sys_path(root, Path.cwd())
    except BaseException:
        target.discard(backend, job_id)
        raise

    spec: protocol.JobSpec = {
        "format": protocol.FORMAT,
        "job_id": job_id,
        "func_name": func_name,
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
        "context_key": protocol.context_key(archive.sha256),
        "context_sha256": archive.sha256,
        "cwd": cwd,
        "sys_path": sys_path,
        "env": env,
        "output_dir": output_dir,
        "has_data": data.has_data,
    }
    if image.install:
        spec["install"] = list(image.install)
    handle = JobHandle(
        job_id=job_id,
        backend=backend.name,
        project=settings.project or "",
        cluster_name=place.cluster_name,
        zone=place.zone,
        namespace=settings.namespace,
        bucket_name=place.bucket_name,
        k8s_name=f"kinetic-{job_id}",
        image_uri=image.uri,
        accelerator=accel.name + (":spot" if accel.spot else ""),
        func_name=func_name,
        display_name=f"kinetic-{func_name}-{job_id}",
        created_at=utcnow_iso(),
        debug=opts.debug,
    )
    try:
        await storage.write(protocol.payload_key(job_id), payload)
        await storage.write(protocol.spec_key(job_id), protocol.dump_json(spec))
        await storage.write(protocol.handle_key(job_id), protocol.dump_json(handle.to_dict()))
        await backend.launch(handle)
    except BaseException:
        target.discard(backend, job_id)
        with anyio.CancelScope(shield=True):
            await storage.delete_prefix(f"{job_id}/")
        raise
    return handle
