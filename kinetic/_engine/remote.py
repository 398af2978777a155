"""``kinetic.aio.run``: the async decorator and the functions it makes."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, Generic, ParamSpec, TypeVar, overload

import anyio
import anyio.to_thread

from kinetic._backends.base import Backend
from kinetic._core.arg_checks import check_run_args, check_run_time_limit
from kinetic._core.config import BACKENDS
from kinetic._core.functions import check_function
from kinetic._core.ids import check_job_id
from kinetic._core.inputs import MapOptions, check_input_mode
from kinetic._core.retries import Retries, check_retries
from kinetic._core.secret_spec import Secret, check_secrets
from kinetic._engine import job_listing, runtime
from kinetic._engine.batch import BatchHandle, member_job
from kinetic._engine.batch_submit import submit_batch
from kinetic._engine.handle import JobHandle, load_handle
from kinetic._engine.preload import settings_with_code
from kinetic._engine.submit import RunOptions, submit
from kinetic._exceptions import ConfigError, JobNotFoundError, ObjectNotFoundError
from runner import protocol

_UNBOUND: Any = object()
P = ParamSpec("P")
R = TypeVar("R")


class AsyncRemoteFunction(Generic[P, R]):
    """A function that runs as a job when called. ``await f(...)`` returns its value.

    Works on methods too: accessed through an instance, the instance is sent
    as the first argument.
    """

    def __init__(
        self, fn: Callable[P, R], options: RunOptions, *, instance: object = _UNBOUND
    ) -> None:
        self.__wrapped__ = check_function(fn)
        self.options = options
        self._instance = instance
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<kinetic remote function {getattr(self.__wrapped__, '__qualname__', '?')}>"

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the call as a job, print its output, and return its value.

        For a ``debug=True`` function, forward the job's debugger to
        ``127.0.0.1:5678`` (a free port when that one is taken), print the launch
        configuration and how to attach instead of the job's output, and return the
        value once the job ends; the forward is closed then.

        :raises: as :meth:`JobHandle.result`, and as :meth:`run_async` for bad input.
        """
        handle = await self.run_async(*args, **kwargs)
        if self.options.debug:
            from kinetic._debug.call import debug_call  # debug calls only: keeps imports light

            debugged: R = await debug_call(handle)
            return debugged
        return await handle.result(stream_logs=True)

    async def run_async(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle[R]:
        """Submit the call as a job; return its handle once it is launched.

        :raises ConfigError: for invalid settings; :raises SerializationError: when an
            argument cannot be pickled. In both cases nothing is left behind.
        """
        call_args = args if self._instance is _UNBOUND else (self._instance, *args)
        return await submit(self.__wrapped__, call_args, kwargs, self.options)

    async def run_async_map(
        self,
        inputs: Iterable[Any],
        input_mode: str = "auto",
        max_concurrent: int | None = None,
        retries: int | Retries | None = None,
        fail_fast: bool = False,
        cancel_running_on_fail: bool = False,
        name: str | None = None,
        tags: Mapping[str, str] | None = None,
        pod_per_input: bool = False,
        reuse_process: bool = False,
    ) -> BatchHandle[R]:
        """Fan the function out over ``inputs``; return once every input is durably recorded.

        :param input_mode: ``"auto"`` (a dict with identifier keys -> ``**kwargs``, a
            list/tuple -> ``*args``, else one argument), ``"single"``, ``"args"``, ``"kwargs"``.
        :param max_concurrent: inputs running at once; None: the backend's default
            (the number of cores on the local backend).
        :param retries: run a failed input again (a cancelled one never is). A number:
            that many extra attempts, at once, whatever the failure (a dead worker's
            input included). A ``kinetic.Retries(count, backoff, initial_delay, on)``:
            as for a single job, only for the function's exceptions named in ``on``,
            after growing delays, which hold no worker (local backend; GKE batches take
            a number, for now). None (the default): the function's ``run(retries=)``,
            else none. An input's attempt shows in its ``status_report().attempt``
            once retried, and in ``KINETIC_ATTEMPT`` (0 first) in a batch that retries.
        :param fail_fast: stop launching inputs after the first final failure.
        :param cancel_running_on_fail: with ``fail_fast``, also end running inputs.
        :param name, tags: labels kept in the batch's manifest.
        :param pod_per_input: on GKE, give each input its own Kubernetes Job (a pod of
            its own, started for it) instead of running the batch on one Job whose
            ``max_concurrent`` pods are a worker pool (the default); no effect locally.
        :param reuse_process: on GKE's worker pool, run inputs one after another in each
            worker's own process instead of a fresh fork of it per input: less time per
            input, but what one input leaves in the process (globals, memory, a crash)
            reaches the next ones, and a running input cannot be cancelled alone. No
            effect locally (local workers always reuse their process) nor with
            ``pod_per_input``.
        :raises ConfigError: for invalid options or empty inputs; :raises SerializationError:
            naming an input that cannot be pickled. Nothing is left behind in either case.
            A function with a run-time limit (``run(timeout=)``) limits each input on
            the local backend (a GKE batch refuses it, for now).
        """
        if retries is None:  # the function's own, a kinetic.Retries (or none)
            retries = self.options.retries or 0
        map_opts = MapOptions(
            input_mode=check_input_mode(input_mode),
            max_concurrent=max_concurrent,
            retries=retries,
            fail_fast=fail_fast,
            cancel_running_on_fail=cancel_running_on_fail,
            name=name,
            tags={} if tags is None else tags,
            reuse_process=reuse_process,
        )
        prefix = () if self._instance is _UNBOUND else (self._instance,)
        return await submit_batch(
            self.__wrapped__,
            inputs,
            self.options,
            map_opts,
            prefix_args=prefix,
            pod_per_input=pod_per_input,
        )

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> AsyncRemoteFunction[P, R]: ...
    @overload
    def __get__(self, instance: object, owner: type[Any]) -> AsyncRemoteFunction[..., R]: ...
    def __get__(self, instance: object | None, owner: type[Any]) -> AsyncRemoteFunction[..., R]:
        if instance is None:
            return self
        # The plain function travels, with the instance as its first argument.
        return AsyncRemoteFunction(self.__wrapped__, self.options, instance=instance)


def run(
    accelerator: str | None = None,
    container_image: str | None = None,
    base_image_repo: str | None = None,
    zone: str | None = None,
    project: str | None = None,
    capture_env_vars: list[str] | None = None,
    cluster: str | None = None,
    backend: str | None = None,
    namespace: str | None = None,
    volumes: Mapping[str, Any] | None = None,
    spot: bool = False,
    output_dir: str | None = None,
    debug: bool = False,
    secrets: Sequence[str | Secret] | None = None,
    timeout: float | None = None,
    retries: int | Retries | None = None,
) -> Callable[[Callable[P, R]], AsyncRemoteFunction[P, R]]:
    """Decorate a function so that calling it runs it as a job; the async original.

    :param accelerator: ``"cpu"``, ``"cpu:4"``, ``"gpu-l4"``, ``"tpu-v5litepod-4"``, ...
        (``:spot`` suffix allowed). Default: ``"cpu"`` on the local backend, the
        original's ``"tpu-v5e-1"`` on GKE.
    :param container_image: a custom image URI for GKE jobs.
    :param base_image_repo: repository of prebuilt base images (GKE, prebuilt mode).
    :param zone, project, cluster, namespace: GCP/GKE target; each falls back to
        ``KINETIC_<NAME>``, then the active profile, then the default.
    :param capture_env_vars: names, or ``PREFIX*`` patterns, of variables sent to the job.
    :param backend: ``"local"``, ``"gke"`` or ``"pathways"``; default ``local`` when no
        GCP project is configured, else ``gke``.
    :param volumes: absolute mount path -> ``kinetic.Data``.
    :param spot: run on spot/preemptible capacity.
    :param output_dir: the job's ``KINETIC_OUTPUT_DIR`` (default under the job's storage).
    :param debug: the job waits (``KINETIC_DEBUG_WAIT_TIMEOUT`` seconds, 600) for a
        debugger before running (see ``JobHandle.debug_attach``); keeps its artifacts
        after its result is collected, and calling the function does not stream its output.
    :param secrets: Kubernetes Secrets the job reads, by reference: a name (every key as
        a variable), or ``kinetic.Secret(name, keys={key: VARIABLE})`` or
        ``kinetic.Secret(name, mount="/abs/dir")`` (files, GKE only). Values never
        travel with the job; locally they come from ``~/.kinetic/secrets/{name}.json``
        or the submitting environment.
    :param timeout: the job's run-time limit in seconds: a function that runs longer is
        ended (with every process it started) and the job fails with
        :class:`JobFailedError` in phase ``execute``, naming the limit. Not the wait's
        bound (``result(timeout=)``). On GKE the Kubernetes Job's
        ``activeDeadlineSeconds`` backs it up. A local batch limits each input; a GKE
        batch refuses it, for now.
    :param retries: run the function again when it raises: a number of extra attempts
        (every ``Exception``, 1 s then doubling delays), or
        ``kinetic.Retries(count, backoff=2.0, initial_delay=1.0, on=(ExcType, ...))``.
        The job's runner retries in the job's process; the handle stays the same, and
        ``status_report()`` shows the attempt and the earlier failures. Also the default
        of the function's batches: each input retries alike (``run_async_map(retries=)``
        overrides it; GKE batches take a plain count, for now). Not for pathways jobs.
    :raises ConfigError: for invalid arguments, at decoration time.
    :raises InvalidFunctionError: when the decorated object cannot run as a job.
    """
    if callable(accelerator):
        raise ConfigError(
            "kinetic.run is a decorator factory: write @kinetic.run() (with parentheses), "
            "or @kinetic.run(accelerator=...)"
        )
    check_run_args(
        {
            "accelerator": accelerator,
            "container_image": container_image,
            "base_image_repo": base_image_repo,
            "zone": zone,
            "project": project,
            "capture_env_vars": capture_env_vars,
            "cluster": cluster,
            "backend": backend,
            "namespace": namespace,
            "spot": spot,
            "output_dir": output_dir,
            "debug": debug,
        }
    )
    options = RunOptions(
        accelerator=accelerator,
        container_image=container_image,
        base_image_repo=base_image_repo,
        zone=zone,
        project=project,
        capture_env_vars=tuple(capture_env_vars) if capture_env_vars is not None else None,
        cluster=cluster,
        backend=backend,
        namespace=namespace,
        volumes=volumes,
        spot=spot,
        output_dir=output_dir,
        debug=debug,
        secrets=() if secrets is None else check_secrets(secrets),
        timeout=check_run_time_limit(timeout),
        retries=check_retries(retries),
    )

    def decorate(fn: Callable[P, R]) -> AsyncRemoteFunction[P, R]:
        return AsyncRemoteFunction(fn, options)

    return decorate


async def attach(
    job_id: str,
    project: str | None = None,
    cluster: str | None = None,
    backend: str | None = None,
) -> JobHandle:
    """Rebuild the handle of a job submitted by any process, from its stored record.

    A batch input's job id (``batch.jobs[i].job_id``) works too: its handle comes from
    the batch's manifest.

    :raises ConfigError: when ``job_id`` is malformed (a path, say).
    :raises JobNotFoundError: when no such job is recorded.
    """
    check_job_id(job_id)
    settings = await anyio.to_thread.run_sync(
        partial(settings_with_code, backend=backend, project=project, cluster=cluster)
    )
    target = runtime.backend_for_settings(settings)
    try:
        return await load_handle(target, job_id)
    except JobNotFoundError:
        member = protocol.parse_member_job_id(job_id)
        if member is None:
            raise
        return await _member_handle(target, job_id, *member)


async def _member_handle(target: Backend, job_id: str, group_id: str, index: int) -> JobHandle:
    try:
        manifest = protocol.load_json(
            await target.storage.read(protocol.group_manifest_key(group_id))
        )
    except ObjectNotFoundError:
        raise JobNotFoundError(f"no job {job_id!r} in {target.storage.url}") from None
    if not 0 <= index < int(manifest.get("total", 0)):
        raise JobNotFoundError(f"no job {job_id!r}: batch {group_id} has no input {index}")
    return member_job(manifest, index)


async def list_jobs(
    project: str | None = None,
    zone: str | None = None,
    cluster: str | None = None,
    namespace: str | None = None,
    backend: str | None = None,
    *,
    batch: str | None = None,
    offset: int = 0,
    limit: int | None = None,
) -> list[JobHandle]:
    """Handles of the jobs recorded in the configured place, newest first.

    Handles are loaded concurrently; a job whose record cannot be read is skipped with a
    warning (logger ``kinetic``). A batch's inputs are not among them (a batch may have
    millions): pass ``batch=`` to list one batch's inputs instead, in input order, a page
    at a time.

    :param batch: a batch's group id (``grp-…``): list its inputs' handles.
    :param offset: with ``batch``, the first input listed.
    :param limit: with ``batch``, at most this many (None: all from ``offset``).
    :raises ConfigError: for an unknown backend, a malformed group id, a negative
        ``offset``/``limit``, or ``offset``/``limit`` without ``batch``.
    :raises JobNotFoundError: when ``batch`` names no recorded batch.
    """
    if batch is None and (offset or limit is not None):
        raise ConfigError("offset and limit page a batch's inputs: pass batch= too")
    target = await _listing_target(project, zone, cluster, namespace, backend)
    if batch is not None:
        handles, _ = await job_listing.batch_inputs(target, batch, offset=offset, limit=limit)
        return handles
    return await job_listing.single_jobs(target)


async def list_batch_page(
    project: str | None,
    zone: str | None,
    cluster: str | None,
    namespace: str | None,
    backend: str | None,
    *,
    batch: str,
    offset: int = 0,
    limit: int | None = None,
) -> tuple[list[JobHandle], int]:
    """``list_jobs(batch=...)``'s page, and the batch's number of inputs (for the CLI)."""
    target = await _listing_target(project, zone, cluster, namespace, backend)
    return await job_listing.batch_inputs(target, batch, offset=offset, limit=limit)


async def _listing_target(
    project: str | None,
    zone: str | None,
    cluster: str | None,
    namespace: str | None,
    backend: str | None,
) -> Backend:
    if backend is not None and backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}")
    settings = await anyio.to_thread.run_sync(
        partial(
            settings_with_code,
            backend=backend,
            project=project,
            zone=zone,
            cluster=cluster,
            namespace=namespace,
        )
    )
    return runtime.backend_for_settings(settings)
