"""The blocking API: declarations that run the ``kinetic.aio`` originals on the loop thread.

Nothing here has behaviour of its own; each method forwards to its async twin
through :mod:`kinetic._sync.portal`. A test (``tests/unit/test_public_api.py``)
keeps the names and parameters of both worlds identical.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from kinetic._core.records import JobRecord
from kinetic._core.status import JobStatus, StatusReport
from kinetic._engine import handle as _aio_handle
from kinetic._engine import remote as _aio_remote
from kinetic._engine.outcome import KnownOutcome, capture
from kinetic._sync.portal import call, iterate

if TYPE_CHECKING:
    from kinetic._sync.batch import BatchHandle

P = ParamSpec("P")
R = TypeVar("R")

StatusChangeCallback = Callable[[JobStatus], None]


class JobHandle(JobRecord):
    """A submitted job (blocking API). Fields as the async handle; see ``kinetic.aio.JobHandle``."""

    # Set on the batch inputs a batch stream yielded: their outcome, already read.
    _outcome: KnownOutcome | None = None

    @property
    def aio(self) -> _aio_handle.JobHandle:
        """The same job as a ``kinetic.aio.JobHandle``."""
        h = _aio_handle.JobHandle(**self.record().__dict__)
        h._outcome = self._outcome
        return h

    @classmethod
    def _from_aio(cls, h: _aio_handle.JobHandle) -> JobHandle:
        job = cls(**h.record().__dict__)
        job._outcome = h._outcome
        return job

    def status(self) -> JobStatus:
        """The job's current status."""
        return call(self.aio.status)

    def status_report(self) -> StatusReport:
        """The status with its details (failure reason, phase)."""
        return call(self.aio.status_report)

    def logs(self, follow: bool = False) -> str | None:
        """The job's output so far; with ``follow=True`` print it until the job ends."""
        return call(self.aio.logs, follow)

    def iter_logs(self) -> Iterator[str]:
        """Yield the job's output in chunks until it ends."""
        return iterate(self.aio.iter_logs)

    def tail(self, n: int = 100) -> str:
        """The last ``n`` lines of the job's output."""
        return call(self.aio.tail, n)

    def result(
        self,
        timeout: float | None = None,
        cleanup: bool | None = None,
        cleanup_timeout: float = 180.0,
        cleanup_poll_interval: float = 2.0,
        stream_logs: bool | None = None,
        on_status_change: StatusChangeCallback | None = None,
    ) -> Any:
        """Block for the job's value; see ``kinetic.aio.JobHandle.result``.

        Ctrl-C stops waiting (KeyboardInterrupt) and leaves the job running.
        """
        outcome = self._outcome
        if outcome is not None and not stream_logs and on_status_change is None:
            # Decoded on this thread: no crossing into the loop for an outcome in hand.
            return _take_blocking(outcome, not self.debug if cleanup is None else cleanup)
        return call(
            functools.partial(
                self.aio.result,
                timeout=timeout,
                cleanup=cleanup,
                cleanup_timeout=cleanup_timeout,
                cleanup_poll_interval=cleanup_poll_interval,
                stream_logs=stream_logs,
                on_status_change=on_status_change,
            )
        )

    def cancel(self, cleanup_timeout: float = 180.0, cleanup_poll_interval: float = 2.0) -> None:
        """End the job if it is still running."""
        call(self.aio.cancel, cleanup_timeout, cleanup_poll_interval)

    def cleanup(
        self,
        k8s: bool = True,
        gcs: bool = True,
        cleanup_timeout: float = 180.0,
        cleanup_poll_interval: float = 2.0,
    ) -> None:
        """Stop the job's compute resources and/or delete its stored artifacts."""
        call(self.aio.cleanup, k8s, gcs, cleanup_timeout, cleanup_poll_interval)


def _take_blocking(outcome: KnownOutcome, cleanup: bool) -> Any:
    """:meth:`KnownOutcome.take` for a blocking caller: the batch's cleanup, when due,
    is the only crossing into the loop."""
    ok, value = capture(outcome.decode)
    if outcome.taken(cleanup):
        call(outcome.cleanup_batch)
    if not ok:
        raise value
    return value


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

    def run_async(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle:
        """Submit the call as a job and return its handle once launched."""
        return JobHandle._from_aio(call(functools.partial(self.aio.run_async, *args, **kwargs)))

    def run_async_map(
        self,
        inputs: Iterable[Any],
        input_mode: str = "auto",
        max_concurrent: int | None = None,
        retries: int = 0,
        fail_fast: bool = False,
        cancel_running_on_fail: bool = False,
        name: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> BatchHandle:
        """Fan out over ``inputs``; see ``kinetic.aio.RemoteFunction.run_async_map``."""
        from kinetic._sync.batch import BatchHandle

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
) -> list[JobHandle]:
    """Handles of the recorded jobs, newest first."""
    found = call(_aio_remote.list_jobs, project, zone, cluster, namespace, backend)
    return [JobHandle._from_aio(h) for h in found]
