"""Recording a batch durably and attaching to one: ``run_async_map`` and ``attach_batch``.

Submission writes the function once, the inputs in chunked objects, and the
manifest last — the commit point, written once and never rewritten — then asks
the backend's batch engine to run it. Validation, pickling and (for a backend whose
jobs run in pods) the image happen before the first write, so bad input leaves
nothing behind. What differs per backend is asked of it
(:meth:`~kinetic._backends.base.Backend.placement`), never read from its name or type.
Nothing is written per input: the inputs are in the chunks.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import cloudpickle

from kinetic._backends.base import Backend, Placement
from kinetic._concurrency import for_each
from kinetic._core.accelerators import AcceleratorConfig
from kinetic._core.arg_checks import check_timeout
from kinetic._core.config import Settings
from kinetic._core.ids import check_group_id, new_group_id
from kinetic._core.image_spec import JobImage
from kinetic._core.inputs import MapOptions, chunk_size, to_call
from kinetic._core.records import job_spec, shared_handle, utcnow_iso
from kinetic._core.secret_spec import records as secret_records
from kinetic._engine import runtime
from kinetic._engine.batch import BatchHandle, CleanedSummary
from kinetic._engine.batch_runner import runner_for
from kinetic._engine.captured_env import capture_job_env
from kinetic._engine.data_refs import PreparedCalls, prepare_calls_data
from kinetic._engine.packaging import (
    apickle_function,
    astore_context,
    dumps,
    find_package_root,
    function_source_dir,
    relative_sys_path,
    shipping_by_value,
)
from kinetic._engine.preload import settings_with_code
from kinetic._engine.submit import (
    RunOptions,
    aresolve_target,
    check_local_secrets,
    job_image,
    undo_submission,
)
from kinetic._exceptions import (
    ConfigError,
    DataError,
    JobNotFoundError,
    ObjectNotFoundError,
    SerializationError,
)
from runner import protocol

_WRITE_CONCURRENCY = 16


def _package_root(fn: Callable[..., Any]) -> Path:
    """The project that travels with ``fn``'s batch. Blocking (stats)."""
    return find_package_root(function_source_dir(fn))


_PLAIN = frozenset({int, float, complex, str, bytes, bool, type(None)})


def _all_plain(items: list[Any]) -> bool:
    """Whether every input is a plain scalar (one argument, no ``Data`` inside)."""
    plain = _PLAIN
    return all(type(item) in plain for item in items)


def _to_calls(
    items: list[Any], mode: str, prefix_args: tuple[Any, ...], plain: bool = False
) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Each input as ``(args, kwargs)``; ``prefix_args`` (a bound method's instance) first.

    ``plain``: the inputs are known to be plain scalars (:func:`_all_plain`), each the
    one argument of its call; the calls then share one empty ``kwargs`` (a call gets
    its own when unpacked), which saves a dict per input in a large batch.

    :raises ConfigError: when an input does not fit ``mode``.
    """
    if plain and mode in ("auto", "single"):
        no_kwargs: dict[str, Any] = {}
        return [((*prefix_args, item), no_kwargs) for item in items]
    calls = [to_call(item, mode, i) for i, item in enumerate(items)]
    if prefix_args:
        calls = [((*prefix_args, *args), kwargs) for args, kwargs in calls]
    return calls


def _pickle_chunks(
    fn: Callable[..., Any],
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]],
    size: int,
    root: Path,
) -> list[bytes]:
    """Pickle the calls, chunk by chunk. Blocking: call in a thread.

    :raises SerializationError: naming the first input that cannot be pickled.
    """
    chunks: list[bytes] = []
    with shipping_by_value(fn, root):
        for start in range(0, len(calls), size):
            part = calls[start : start + size]
            try:
                chunks.append(dumps(part))
            except Exception as exc:
                for offset, call in enumerate(part):
                    try:
                        cloudpickle.dumps(call)
                    except Exception as inner:
                        raise SerializationError(
                            f"input {start + offset} cannot be pickled "
                            f"({type(inner).__name__}: {inner})"
                        ) from inner
                raise SerializationError(f"inputs cannot be pickled: {exc}") from exc
    return chunks


async def submit_batch(
    fn: Callable[..., Any],
    inputs: Iterable[Any],
    opts: RunOptions,
    map_opts: MapOptions,
    *,
    prefix_args: tuple[Any, ...] = (),
    pod_per_input: bool = False,
) -> BatchHandle:
    """Record a batch durably, start running it, and return its handle.

    :param map_opts: ``run_async_map``'s options, validated when they were built.
    :param pod_per_input: on GKE, run each input in its own Kubernetes Job (pod) instead
        of on a pool of worker pods (the default); no effect on the local backend.

    :raises ConfigError: for an invalid ``pod_per_input``, empty inputs, or inputs that do
        not fit ``input_mode`` — nothing is written.
    :raises SerializationError: naming an input that cannot be pickled — nothing is written.
    :raises BackendError: for a backend that cannot run batches (nothing is written), or
        when launching failed (the batch is recorded: ``attach_batch`` resumes it).
    """
    if not isinstance(pod_per_input, bool):
        raise ConfigError(f"pod_per_input must be True or False, got {pod_per_input!r}")
    if opts.volumes:
        # Not silently dropped: a batch's inputs would not find their data.
        raise DataError(
            "volumes are not supported by run_async_map: pass the data as an argument "
            "of each call (kinetic.Data), or submit single jobs with run_async"
        )
    if opts.debug:
        # Not silently ignored: a batch's inputs do not wait for a debugger.
        raise ConfigError(
            "debug=True is for single jobs: call the function, or use run_async, to step "
            "through one input with a debugger; decorate without debug=True to map"
        )
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Iterable):
        raise ConfigError("inputs must be an iterable of inputs (a list, a range, ...)")
    items = list(inputs)
    if not items:
        raise ConfigError("inputs must be non-empty")
    settings, accel, backend = await aresolve_target(opts)
    runner = runner_for(backend)
    root = await anyio.to_thread.run_sync(_package_root, fn)
    # Before anything is written: a bad requirement or a failed build is bad input.
    await backend.get_ready()
    image = await job_image(backend, settings, accel, opts.container_image, root)
    if opts.secrets and backend.placement(settings).runs_here:
        await check_local_secrets(opts.secrets)
    group_id = new_group_id()
    storage = backend.storage
    # Recorded first, so attach_batch in another process can wait for this submission.
    recording: protocol.RecordingRecord = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started_at": utcnow_iso(),
    }
    await storage.write(protocol.group_recording_key(group_id), protocol.dump_json(recording))
    try:
        manifest = await _record(
            fn, items, opts, map_opts, group_id, settings, accel, backend, image,
            prefix_args=prefix_args, pod_per_input=pod_per_input,
        )  # fmt: skip
    except BaseException:
        with anyio.CancelScope(shield=True):
            await undo_submission(storage, protocol.group_prefix(group_id))
        raise
    # From here on the batch is durable: a failed launch is repaired by any attach —
    # unless the launch says the batch can never run (a missing namespace, say).
    try:
        await runner.launch(group_id)
    except ConfigError:
        with anyio.CancelScope(shield=True):
            await undo_submission(storage, protocol.group_prefix(group_id))
        raise
    return BatchHandle(backend=backend, manifest=manifest)


def _engine(place: Placement, *, pod_per_input: bool) -> protocol.BatchEngine:
    """The engine of a batch that runs in pods."""
    if pod_per_input:
        return protocol.ENGINE_POD_PER_INPUT
    if place.images is not None and place.images.pool_engine == "coordinated":
        return protocol.ENGINE_COORDINATED
    return protocol.ENGINE_POOL


def _captured_env(opts: RunOptions) -> dict[str, str]:
    return capture_job_env(list(opts.capture_env_vars or ()), os.environ)


_RECORDING_POLL = 0.05
"""Seconds between reads of a manifest still being recorded: the submitter writes it once,
at its commit point, so there is no event to wait for across processes and machines."""


async def attach_batch(
    group_id: str,
    project: str | None = None,
    cluster: str | None = None,
    poll_interval: float | None = None,
    poll_timeout: float | None = None,
    *,
    backend: str | None = None,
    timeout: float | None = None,
) -> BatchHandle:
    """Rebuild a batch's handle in any process, and make sure it is driven to completion.

    If the submitting process is still recording the batch, waits for the manifest,
    reading it every ``poll_interval`` seconds (default 0.05): for as long as it takes
    (``None``, the default, as the original's ``poll_timeout=None``), or up to
    ``poll_timeout`` (the original's name) or ``timeout`` seconds. If the submitter died
    before committing the batch (seen from its machine), that is a clear error at once:
    its inputs were never all recorded.

    :raises ConfigError: for a malformed id or a non-positive interval or timeout.
    :raises JobNotFoundError: for an unknown batch, one whose submitter died before
        committing it, or one still not committed when the timeout passed.
    """
    check_group_id(group_id)
    if poll_timeout is not None:
        timeout = poll_timeout
    interval = _RECORDING_POLL if poll_interval is None else poll_interval
    check_timeout("poll_timeout", timeout)
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval <= 0:
        raise ConfigError(f"attach_batch: poll_interval must be > 0, got {interval!r}")
    settings = await anyio.to_thread.run_sync(
        partial(settings_with_code, backend=backend, project=project, cluster=cluster)
    )
    target = runtime.backend_for_settings(settings)
    runner_for(target)  # raises BackendError for a backend without batches
    storage = target.storage
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            manifest = protocol.load_manifest(
                await storage.read(protocol.group_manifest_key(group_id))
            )
            break
        except ObjectNotFoundError:
            pass
        recording: protocol.RecordingRecord | None = await _read_json(
            storage, protocol.group_recording_key(group_id)
        )
        if recording is None:
            raise JobNotFoundError(f"no batch {group_id!r} in {storage.url}")
        # The pid says something only on the machine that recorded the batch.
        here = recording.get("host", socket.gethostname()) == socket.gethostname()
        gone = here and not _pid_alive(int(recording.get("pid", 0)))
        if gone:
            raise JobNotFoundError(
                f"batch {group_id} was never fully recorded (its submitting process stopped "
                "before all inputs were stored); submit it again"
            )
        if deadline is not None and time.monotonic() > deadline:
            raise JobNotFoundError(
                f"batch {group_id} was not fully recorded within {timeout}s (its submitting "
                f"process, pid {recording.get('pid')} on {recording.get('host')}, may still "
                "be recording it, or have stopped): attach again later, or with "
                "poll_timeout=None to wait for as long as it takes"
            )
        await anyio.sleep(interval)
    handle = BatchHandle(backend=target, manifest=manifest)
    summary: CleanedSummary | None = await _read_json(storage, protocol.group_summary_key(group_id))
    if summary is not None:
        handle._restore_summary(summary)
    return handle


async def _read_json(storage: Any, key: str) -> Any:
    try:
        return protocol.load_json(await storage.read(key))
    except ObjectNotFoundError:
        return None


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def _record(
    fn: Callable[..., Any],
    items: list[Any],
    opts: RunOptions,
    map_opts: MapOptions,
    group_id: str,
    settings: Settings,
    accel: AcceleratorConfig,
    backend: Backend,
    image: JobImage,
    *,
    prefix_args: tuple[Any, ...],
    pod_per_input: bool = False,
) -> protocol.BatchManifest:
    """Pickle and store everything of a batch; the manifest, written last, is returned.

    :raises ConfigError, DataError, SerializationError: before anything but the
        recording marker was written (the caller removes the group).
    """
    storage = backend.storage
    root = await anyio.to_thread.run_sync(_package_root, fn)
    place = backend.placement(settings)
    engine = _engine(place, pod_per_input=pod_per_input)
    # Workers (local, or a GKE pool) stream through many inputs: few, large chunks. A
    # pod per input reads only its input's chunk: at most pod_chunk inputs each.
    size = (
        chunk_size(len(items), target_chunks=1, max_size=place.pod_chunk)
        if pod_per_input and place.pod_chunk is not None
        else chunk_size(len(items))
    )
    # Every input is looked at: large batches take milliseconds, so not on the loop.
    # Plain scalar inputs (the usual large batch) hold no Data: nothing to look for.
    input_mode = map_opts.input_mode
    plain = input_mode in ("auto", "single") and not prefix_args
    plain = plain and await anyio.to_thread.run_sync(_all_plain, items)
    calls = await anyio.to_thread.run_sync(_to_calls, items, input_mode, prefix_args, plain)
    data = (
        PreparedCalls(calls)
        if plain
        else await prepare_calls_data(calls, storage=backend.storage, local_backend=place.runs_here)
    )
    fn_bytes = await apickle_function(fn, root)
    chunks = await anyio.to_thread.run_sync(_pickle_chunks, fn, data.calls, size, root)
    archive = await astore_context(
        storage, root, exclude=(Path(settings.local_root), *data.local_paths)
    )
    sys_path, cwd = await anyio.to_thread.run_sync(relative_sys_path, root, Path.cwd())

    func_name = getattr(fn, "__name__", type(fn).__name__)
    output_dir = opts.output_dir or place.outputs
    spec = job_spec(
        job_id=group_id,
        func_name=func_name,
        payload_sha256=hashlib.sha256(fn_bytes).hexdigest(),
        context_sha256=archive.sha256,
        cwd=cwd,
        sys_path=sys_path,
        env=_captured_env(opts),
        output_dir=output_dir,
        has_data=data.has_data,
        install=image.install,
        install_kept=image.install_kept,
    )
    if opts.secrets and place.runs_here:  # resolved by the workers (runner/secrets.py)
        spec["secrets"] = secret_records(opts.secrets)
    if opts.timeout is not None:  # each input's run-time limit (runner/time_limit.py)
        spec["timeout"] = opts.timeout
    manifest: protocol.BatchManifest = {
        "format": protocol.FORMAT,
        "group_id": group_id,
        "group_kind": "map",
        "name": map_opts.name,
        "tags": dict(map_opts.tags),
        "func_name": func_name,
        "total": len(items),
        "chunk_size": size,
        "n_chunks": len(chunks),
        "delivery": protocol.DELIVERY,
        "created_at": utcnow_iso(),
        "options": map_opts.record(place.batch_concurrency),
        "spec": spec,
        "handle": shared_handle(
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
    }
    if not place.runs_here:  # what the batch's pods run
        manifest["gke"] = {
            "image": image.uri,
            "namespace": settings.namespace,
            "accelerator": accel.name + (":spot" if accel.spot else ""),
            "fuse_buckets": sorted(data.fuse_buckets),  # mounted read-only in every pod
            "engine": engine,
            "lease_s": protocol.POOL_LEASE_SECONDS,
            "reuse_process": map_opts.reuse_process,
        }
        if image.runner:  # a custom image: its pods get Kinetic's runner from this one
            manifest["gke"]["runner_image"] = image.runner
        if opts.secrets:  # references only: a resumed batch's pods read the same
            manifest["gke"]["secrets"] = secret_records(opts.secrets)
    await storage.write(protocol.group_payload_key(group_id), fn_bytes)

    async def _write_chunk(numbered: tuple[int, bytes]) -> None:
        n, chunk = numbered
        await storage.write(protocol.group_inputs_key(group_id, n), chunk)

    await for_each(list(enumerate(chunks)), _write_chunk, limit=_WRITE_CONCURRENCY)
    await storage.write(protocol.group_manifest_key(group_id), protocol.dump_json(manifest))
    return manifest
