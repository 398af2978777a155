"""The GKE Container API over Kinetic's HTTP edge (:mod:`kinetic._http`): send the requests of :mod:`kinetic._infra.gke_api`.

Theory of operation
-------------------
Every call goes through :meth:`ContainerClient._send`, where the edge's rules hold
(:mod:`kinetic._http`) with these answer rules:

* **Auth.** Each attempt carries a fresh ``Authorization: Bearer`` token from the
  token source (the Google auth library's Application Default Credentials, see
  :func:`kinetic._images.gauth.google_token_source`); nothing here mints tokens.
* **Deadline.** The whole call, retries included, runs under ``anyio.fail_after``.
* **Retries.** HTTP 429 and 5xx and transport errors are retried with jittered
  exponential back-off (tenacity); so is ``FAILED_PRECONDITION`` while another
  operation runs on the cluster (GKE runs one at a time).
* **Translation.** 404 is None for the caller; 400 is :class:`~kinetic.ConfigError`
  (the request was wrong: bad machine type, quota shape); 401/403 are
  :class:`~kinetic.BackendError` with a hint about credentials and the API being
  enabled; anything else is BackendError naming the call. No aiohttp exception escapes.

Long calls answer with an operation: :meth:`ContainerClient.wait` polls it every
``poll_interval`` seconds (reporting its status through ``progress``) until it is
done, bounded by its own timeout (:class:`~kinetic.JobTimeoutError`: the operation
goes on in Google's hands; ``kinetic status`` shows where it got to).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from kinetic._exceptions import BackendError, ConfigError
from kinetic._http import HttpClient, HttpOwner, Reply, TokenSource, Transient
from kinetic._infra import gke_api
from kinetic._infra.gke_api import ApiRequest, ClusterInfo, Operation, PoolInfo
from kinetic._infra.long_ops import poll_until_done

log = logging.getLogger(__name__)

Progress = Callable[[str], None]
DEFAULT_TIMEOUT = 30.0
"""Seconds for one API call, retries included."""
OPERATION_TIMEOUT = 1800.0
"""Seconds an operation (cluster creation: typically 5-10 minutes) may take."""


class ContainerClient(HttpOwner):
    """An async client for the few Container API calls ``kinetic up`` makes.

    :param token: returns a valid access token (refreshed by the auth library).
    :param project: the GCP project.
    :param location: the cluster's zone (or region).
    :param base_url: the API root (tests: a loopback server's).
    :param attempts: tries per call, the first included.
    :param backoff: upper bound of the first back-off, in seconds.
    :param poll_interval: seconds between two polls of an operation.

    Use it as an async context manager (it owns one connection pool).
    """

    def __init__(
        self,
        token: TokenSource,
        *,
        project: str,
        location: str,
        base_url: str = gke_api.CONTAINER_API,
        attempts: int = 4,
        backoff: float = 0.5,
        poll_interval: float = 5.0,
    ) -> None:
        self._token = token
        self.project = project
        self.location = location
        self._http = HttpClient(
            base_url=base_url,
            attempts=attempts,
            backoff=backoff,
            error=BackendError,
            prefix="GKE: ",
        )
        self.poll_interval = poll_interval

    def __repr__(self) -> str:
        return f"ContainerClient(project={self.project!r}, location={self.location!r})"

    # -- the boundary -----------------------------------------------------------------

    async def _send(self, req: ApiRequest, *, timeout: float = DEFAULT_TIMEOUT) -> Any:
        """Send ``req`` under the module's rules; its JSON, or None on 404.

        :raises ConfigError: HTTP 400 (the request is wrong).
        :raises BackendError: refused, failed, or no answer within ``timeout``.
        """
        what = req.what or f"{req.method} {req.path}"
        return await self._http.request(
            req.method,
            req.path,
            what=what,
            token=self._token,
            answer=lambda reply: self._answer(reply, what),
            timeout=timeout,
            json=req.body,
        )

    @staticmethod
    def _answer(reply: Reply, what: str) -> Any:
        status = reply.status
        if status < 300:
            return reply.json() if reply.body else {}
        word, message = gke_api.error_message(status, reply.body)
        if status == 404:
            return None
        if status == 429 or status >= 500:
            raise Transient(f"HTTP {status} {word}: {message}")
        if status == 400 and word == "FAILED_PRECONDITION" and "operation" in message.lower():
            raise Transient(
                f"HTTP {status} {word}: {message}"
            )  # another operation runs: wait our turn
        if status == 400:
            raise ConfigError(f"GKE refused {what}: {message or word}")
        if status in (401, 403):
            raise BackendError(
                f"GKE refused {what} (HTTP {status} {word}): {message}. Check the credentials "
                "(gcloud auth application-default login), their roles in the project, and "
                "that the Kubernetes Engine API is enabled"
            )
        raise BackendError(f"GKE: {what} failed (HTTP {status} {word}): {message}")

    # -- operations -------------------------------------------------------------------

    async def wait(
        self,
        operation: Mapping[str, Any],
        *,
        timeout: float = OPERATION_TIMEOUT,
        progress: Progress | None = None,
    ) -> Operation:
        """Poll ``operation`` until it is done.

        :raises BackendError: the operation failed (its error message), or vanished.
        :raises JobTimeoutError: not done within ``timeout`` seconds (it goes on).
        """
        try:
            op = gke_api.parse_operation(operation)
        except ValueError as exc:
            raise BackendError(f"GKE answered something other than an operation: {exc}") from exc

        async def fetch(name: str) -> Mapping[str, Any] | None:
            doc: Mapping[str, Any] | None = await self._send(
                gke_api.get_operation(self.project, self.location, name)
            )
            return doc

        def tick(op: Operation, took: float) -> None:
            if progress is not None:
                progress(f"{op.kind or 'operation'} {op.name}: {op.status} ({took:.0f}s)")

        return await poll_until_done(
            op,
            fetch=fetch,
            parse=gke_api.parse_operation,
            interval=self.poll_interval,
            timeout=timeout,
            label=lambda op: f"GKE operation {op.name} ({op.kind})",
            late=lambda op: (
                f"GKE operation {op.name} ({op.kind}) still {op.status} after {timeout:g}s; "
                "it goes on: see `kinetic status`"
            ),
            tick=tick,
        )

    # -- calls ------------------------------------------------------------------------

    async def get_cluster(self, cluster: str) -> ClusterInfo | None:
        """The cluster, or None when it does not exist."""
        doc = await self._send(gke_api.get_cluster(self.project, self.location, cluster))
        return None if doc is None else gke_api.parse_cluster(doc)

    async def list_clusters(self) -> list[ClusterInfo]:
        """The project's clusters, in every location (``kinetic init`` offers them)."""
        doc = await self._send(gke_api.list_clusters(self.project))
        return [gke_api.parse_cluster(c) for c in (doc or {}).get("clusters") or []]

    async def create_cluster(
        self,
        cluster: str,
        *,
        timeout: float = OPERATION_TIMEOUT,
        progress: Progress | None = None,
        **options: Any,
    ) -> ClusterInfo:
        """Create ``cluster`` (see :func:`gke_api.create_cluster`) and wait until it runs.

        :raises BackendError: refused, or the creation failed.
        :raises JobTimeoutError: still being created after ``timeout``.
        """
        op = await self._send(
            gke_api.create_cluster(self.project, self.location, cluster, **options)
        )
        await self.wait(op, timeout=timeout, progress=progress)
        info = await self.get_cluster(cluster)
        if info is None:
            raise BackendError(f"GKE: cluster {cluster} is missing after its creation")
        return info

    async def delete_cluster(
        self, cluster: str, *, timeout: float = OPERATION_TIMEOUT, progress: Progress | None = None
    ) -> bool:
        """Delete ``cluster`` and wait until it is gone; False when it did not exist."""
        op = await self._send(gke_api.delete_cluster(self.project, self.location, cluster))
        if op is None:
            return False
        await self.wait(op, timeout=timeout, progress=progress)
        return True

    async def list_pools(self, cluster: str) -> list[PoolInfo]:
        """The cluster's node pools.

        :raises ConfigError: the cluster does not exist.
        """
        doc = await self._send(gke_api.list_pools(self.project, self.location, cluster))
        if doc is None:
            raise ConfigError(self._no_cluster(cluster))
        return [gke_api.parse_pool(p) for p in doc.get("nodePools") or []]

    async def create_pool(
        self,
        cluster: str,
        pool: Mapping[str, Any],
        *,
        timeout: float = OPERATION_TIMEOUT,
        progress: Progress | None = None,
    ) -> None:
        """Create a node pool (a body from :func:`gke_api.node_pool`) and wait for it.

        :raises ConfigError: the cluster does not exist, or the pool exists already.
        """
        try:
            op = await self._send(gke_api.create_pool(self.project, self.location, cluster, pool))
        except BackendError as exc:
            if "HTTP 409" in str(exc):
                raise ConfigError(
                    f"node pool {pool['name']} exists already in {cluster} "
                    "(`kinetic pool list`; choose another --name)"
                ) from exc
            raise
        if op is None:
            raise ConfigError(self._no_cluster(cluster))
        await self.wait(op, timeout=timeout, progress=progress)

    async def delete_pool(
        self,
        cluster: str,
        name: str,
        *,
        timeout: float = OPERATION_TIMEOUT,
        progress: Progress | None = None,
    ) -> bool:
        """Delete a node pool and wait; False when it did not exist."""
        op = await self._send(gke_api.delete_pool(self.project, self.location, cluster, name))
        if op is None:
            return False
        await self.wait(op, timeout=timeout, progress=progress)
        return True

    def _no_cluster(self, cluster: str) -> str:
        return (
            f"no GKE cluster {cluster!r} in project {self.project}, location {self.location} "
            "(create it with `kinetic up`)"
        )
