"""The blocking API: declarations that run the ``kinetic.aio`` originals on the loop thread.

Nothing here has behaviour of its own; each method forwards to its async twin
through :mod:`kinetic._sync.portal`. A test (``tests/unit/test_public_api.py``)
keeps the names and parameters of both worlds identical.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, ParamSpec, TypeVar, overload

from kinetic._core.retries import Retries
from kinetic._core.secret_spec import Secret
from kinetic._engine import remote as _aio_remote
from kinetic._sync.batch import BatchHandle
from kinetic._sync.handle import JobHandle
from kinetic._sync.portal import call

P = ParamSpec("P")
R = TypeVar("R")


class RemoteFunction(Generic[P, R]):
    """A function that runs as a job when called (blocking API).

    ``f(...)`` blocks for the value, ``f.run_async(...)`` returns a
    :class:`JobHandle`, and ``f.aio`` is the async original.
    """

    def __init__(self, aio: _aio_remote.AsyncRemoteFunction[P, R]) -> None:
        self.aio = aio
        functools.update_wrapper(self, aio.__wrapped__)

    def __repr__(self) -> str:
        return repr(self.aio)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the call as a job, print its output, and return its value."""
        return call(functools.partial(self.aio, *args, **kwargs))

    def run_async(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle[R]:
        """Submit the call as a job and return its handle once launched."""
        return JobHandle._from_aio(call(functools.partial(self.aio.run_async, *args, **kwargs)))

    def run_async_map(
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
        """Fan out over ``inputs``; see ``kinetic.aio.RemoteFunction.run_async_map``."""
        return BatchHandle(
            call(
                functools.partial(
                    self.aio.run_async_map,
                    inputs,
                    input_mode=input_mode,
                    max_concurrent=max_concurrent,
                    retries=retries,
                    fail_fast=fail_fast,
                    cancel_running_on_fail=cancel_running_on_fail,
                    name=name,
                    tags=tags,
                    pod_per_input=pod_per_input,
                    reuse_process=reuse_process,
                )
            )
        )

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> RemoteFunction[P, R]: ...
    @overload
    def __get__(self, instance: object, owner: type[Any]) -> RemoteFunction[..., R]: ...
    def __get__(self, instance: object | None, owner: type[Any]) -> RemoteFunction[..., R]:
        if instance is None:
            return self
        return RemoteFunction(self.aio.__get__(instance, owner))


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
) -> Callable[[Callable[P, R]], RemoteFunction[P, R]]:
    """Decorate a function so that calling it runs it as a job and blocks for its value.

    Parameters as ``kinetic.aio.run``; the decorated function also has
    ``run_async()`` (returns a :class:`JobHandle`) and ``aio`` (the async original).
    """
    decorate = _aio_remote.run(
        accelerator=accelerator,
        container_image=container_image,
        base_image_repo=base_image_repo,
        zone=zone,
        project=project,
        capture_env_vars=capture_env_vars,
        cluster=cluster,
        backend=backend,
        namespace=namespace,
        volumes=volumes,
        spot=spot,
        output_dir=output_dir,
        debug=debug,
        secrets=secrets,
        timeout=timeout,
        retries=retries,
    )

    def wrap(fn: Callable[P, R]) -> RemoteFunction[P, R]:
        return RemoteFunction(decorate(fn))

    return wrap


def attach(
    job_id: str,
    project: str | None = None,
    cluster: str | None = None,
    backend: str | None = None,
) -> JobHandle:
    """Rebuild a job's handle from its stored record, from any process."""
    return JobHandle._from_aio(call(_aio_remote.attach, job_id, project, cluster, backend))


def list_jobs(
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
    """Handles of the recorded jobs, newest first; with ``batch=``, a page of that
    batch's inputs (see ``kinetic.aio.list_jobs``)."""
    found = call(
        functools.partial(
            _aio_remote.list_jobs,
            project,
            zone,
            cluster,
            namespace,
            backend,
            batch=batch,
            offset=offset,
            limit=limit,
        )
    )
    return [JobHandle._from_aio(h) for h in found]
