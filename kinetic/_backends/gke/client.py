"""The one door to the Kubernetes API: Kinetic's HTTP edge (:mod:`kinetic._http`), bounded
and translated.

Theory of operation
-------------------
:class:`KubeClient` loads its configuration lazily, inside the running loop, on
the first request: ``$KUBECONFIG`` (or ``~/.kube/config``) when present, else the
in-cluster service account (:mod:`kinetic._backends.gke.endpoint`, which reads the
files and builds TLS in a worker thread). Its :class:`~kinetic._http.HttpClient` then
opens the endpoint's session (:meth:`~kinetic._backends.gke.endpoint.Endpoint.open_session`)
and it presents, per request, what :class:`~kinetic._backends.gke.credentials.Credentials`
gives (a token, basic auth, an exec plugin's token or client certificate). It speaks
raw JSON: the objects it returns are the dicts the API server sent, which the pure
rules in :mod:`kinetic._core.k8s_status` read.

Every request goes through :meth:`KubeClient._request`, a call of the edge (its deadline,
retries and translation) whose attempts follow these rules:

* **Rate limit.** One token of the client-side bucket per request sent (watches: per
  (re)connection), see :class:`~kinetic._backends.gke.ratelimit.RateLimiter`.
* **Credentials.** A 401 answer drops a credential that can change (token file,
  exec plugin) and sends the request once more with a new one.
* **Retries.** HTTP 429 and 5xx are :class:`~kinetic._http.Transient` (the edge retries
  them, and connection errors, resets and one attempt's timeout). A ``POST`` that was
  retried and then meets ``409 AlreadyExists`` succeeded the first time.
* **Translation.** A missing namespace is :class:`~kinetic.ConfigError`; 404 on the
  object itself is ``None``/``False`` for the caller; every other failure is
  :class:`~kinetic.BackendError` naming the request, with the cause chained. No
  aiohttp, ``ssl`` or ``OSError`` exception escapes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import anyio

from kinetic._backends.gke.credentials import Credentials
from kinetic._backends.gke.endpoint import Endpoint, load_endpoint
from kinetic._backends.gke.ratelimit import RateLimiter
from kinetic._exceptions import BackendError, ConfigError
from kinetic._http import HttpClient, Transient

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 30.0
"""Seconds allowed for one API call, retries included."""

_JSON = "application/json"


class KubeHTTPError(Exception):
    """One attempt's non-2xx answer (internal: translated before leaving the client)."""

    def __init__(self, status: int, body: Mapping[str, Any], what: str) -> None:
        self.status = status
        self.body = body
        self.what = what
        super().__init__(f"{what}: HTTP {status} {body.get('message') or body.get('reason')}")

    @property
    def reason(self) -> str:
        return str(self.body.get("reason") or "")


class KubeClient:
    """An async Kubernetes API client for the few calls Kinetic makes.

    :param kubeconfig: kubeconfig file; default ``$KUBECONFIG``, then
        ``~/.kube/config``, then the in-cluster service account.
    :param context: kubeconfig context; default the file's current context.
    :param qps: sustained requests per second (client-side rate limit).
    :param burst: requests allowed at once before the rate limit applies.
    :param attempts: tries per request for transient faults, the first included.
    :param backoff: upper bound of the first back-off, in seconds (doubles per retry).
    """

    def __init__(
        self,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        cluster_context: str | None = None,
        context_override: str | None = None,
        qps: float = 20.0,
        burst: int = 40,
        attempts: int = 5,
        backoff: float = 0.2,
    ) -> None:
        self._kubeconfig = kubeconfig
        self._context = context
        # Chosen at load time, from the kubeconfig's contexts (kinetic._core.kube_context).
        self._cluster_context = cluster_context
        self._context_override = context_override
        self.limiter = RateLimiter(qps, burst)
        self._attempts = attempts
        self._backoff = backoff
        self._endpoint: Endpoint | None = None
        self._credentials: Credentials | None = None
        self._http: HttpClient | None = None
        self._init_lock = anyio.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"KubeClient(kubeconfig={self._kubeconfig!r}, context={self._context!r})"

    @property
    def requests_sent(self) -> int:
        """Requests sent so far (each retry and each watch connection counts)."""
        return self.limiter.acquired

    # -- configuration ----------------------------------------------------------------

    async def _connection(self) -> tuple[Endpoint, Credentials, HttpClient]:
        if self._http is None and not self._closed:
            async with self._init_lock:
                if self._http is None and not self._closed:
                    await self._load()
        if self._closed or self._http is None:
            raise BackendError("the Kubernetes client is closed")
        assert self._endpoint is not None
        assert self._credentials is not None
        return self._endpoint, self._credentials, self._http

    async def _load(self) -> None:
        """Read the configuration (worker thread); the session opens on the first send
        (this loop).

        :raises ConfigError: no usable configuration.
        """
        endpoint = await load_endpoint(
            kubeconfig_path=self._kubeconfig,
            context=self._context,
            cluster_context=self._cluster_context,
            context_override=self._context_override,
        )
        if self._closed:  # closed while the configuration loaded: open nothing
            return
        self._endpoint, self._credentials = endpoint, Credentials(endpoint)
        self._http = HttpClient(
            error=BackendError,
            prefix="Kubernetes API: ",
            attempts=self._attempts,
            backoff=self._backoff,
            max_backoff=5.0,
            opener=endpoint.open_session,
        )

    async def credentials_for_another_loop(self) -> Credentials:
        """This client's endpoint and credentials, for connections it does not make
        itself on another event loop (the port-forward websockets of debug mode,
        :class:`~kinetic._backends.gke.portforward.PodPortForward`).

        :raises ConfigError: the Kubernetes configuration cannot be loaded.
        :raises BackendError: the client is closed.
        """
        _, credentials, _ = await self._connection()
        return credentials.for_another_loop()

    # -- the boundary -----------------------------------------------------------------

    async def _open(
        self,
        method: str,
        path: str,
        *,
        what: str,
        query: list[tuple[str, Any]] | None = None,
        body: Any = None,
        read_timeout: float | None,
        total: float | None,
    ) -> aiohttp.ClientResponse:
        """Send one request; return the open response (2xx) or raise KubeHTTPError.

        A 401 to a credential that can change is answered by sending once more with a
        new one (each send takes a rate-limit token)."""
        endpoint, credentials, http = await self._connection()
        headers = {"Accept": _JSON}
        data: bytes | None = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/merge-patch+json" if method == "PATCH" else _JSON
        params = [(str(k), _query_value(v)) for k, v in query or ()]
        timeout = aiohttp.ClientTimeout(total=total, sock_connect=10, sock_read=read_timeout)
        for send in (1, 2):
            auth = await credentials.auth()
            await self.limiter.acquire()
            resp = await http.open(
                method,
                endpoint.url(path),
                params=params,
                data=data,
                headers={**headers, **auth.headers},
                timeout=timeout,
                **endpoint.options(auth),
            )
            if resp.status == 401 and send == 1 and credentials.invalidate(auth):
                log.debug("Kubernetes API: %s refused the credential (401); renewing it", what)
                resp.release()
                continue
            break
        if resp.status >= 400:
            try:
                raw = await resp.read()
            finally:
                resp.release()
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = {"message": raw[:200].decode(errors="replace")}
            raise KubeHTTPError(resp.status, parsed if isinstance(parsed, dict) else {}, what)
        return resp

    async def _request(
        self,
        method: str,
        path: str,
        *,
        what: str,
        namespace: str | None = None,
        query: list[tuple[str, Any]] | None = None,
        body: Any = None,
        timeout: float = DEFAULT_TIMEOUT,
        raw: bool = False,
    ) -> Any:
        """Send a request under the rules of the module docstring; return its JSON
        (or text with ``raw``), or None on 404 of the object itself."""
        _, _, http = await self._connection()

        async def attempt(tries: int) -> Any:
            try:
                resp = await self._open(
                    method,
                    path,
                    what=what,
                    query=query,
                    body=body,
                    read_timeout=None,
                    total=timeout,
                )
            except KubeHTTPError as exc:
                if exc.status == 429 or exc.status >= 500:
                    message = exc.body.get("message") or exc.reason
                    raise Transient(f"HTTP {exc.status}: {message}") from exc
                if exc.status == 409 and method == "POST" and tries > 1:
                    return None  # our earlier attempt created it
                return self._translate_http(exc, namespace)
            try:
                data = await resp.read()
            finally:
                resp.release()
            text = data.decode(errors="replace")
            return text if raw else (json.loads(text) if text else None)

        return await http.call(what, attempt, timeout=timeout)

    @staticmethod
    def _translate_http(exc: KubeHTTPError, namespace: str | None) -> None:
        details = exc.body.get("details") or {}
        if exc.status == 404:
            if namespace is not None and details.get("kind") == "namespaces":
                raise ConfigError(
                    f"Kubernetes namespace {namespace!r} does not exist "
                    "(create it, or pass namespace= / set KINETIC_NAMESPACE)"
                ) from exc
            return
        message = str(exc.body.get("message") or exc.reason or "")
        if exc.status in (401, 403):
            raise BackendError(
                f"Kubernetes API refused {exc.what} (HTTP {exc.status}): {message}"
            ) from exc
        raise BackendError(
            f"Kubernetes API: {exc.what} failed (HTTP {exc.status}): {message}"
        ) from exc

    # -- calls ------------------------------------------------------------------------

    async def create_job(
        self,
        namespace: str,
        manifest: Mapping[str, Any],
        *,
        exist_ok: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> bool:
        """Create a ``batch/v1`` Job.

        :param exist_ok: a Job of that name existing already is success (names that are
            deterministic make creation idempotent).
        :returns: False when ``exist_ok`` and the Job already existed, else True.
        :raises ConfigError: the namespace does not exist.
        :raises BackendError: refused (exists already, invalid, forbidden) or unreachable.
        """
        path = f"/apis/batch/v1/namespaces/{namespace}/jobs"
        return await self._create(path, "Job", namespace, manifest, exist_ok, timeout)

    async def create_secret(
        self, namespace: str, manifest: Mapping[str, Any], *, timeout: float = DEFAULT_TIMEOUT
    ) -> bool:
        """Create a ``v1`` Secret; one of that name existing already is success.

        :returns: False when it existed, else True.
        :raises BackendError: refused (invalid, forbidden) or unreachable.
        """
        path = f"/api/v1/namespaces/{namespace}/secrets"
        return await self._create(path, "Secret", namespace, manifest, True, timeout)

    async def _create(
        self,
        path: str,
        kind: str,
        namespace: str,
        manifest: Mapping[str, Any],
        exist_ok: bool,
        timeout: float,
    ) -> bool:
        name = manifest["metadata"]["name"]
        try:
            await self._request(
                "POST",
                path,
                what=f"create {kind} {namespace}/{name}",
                namespace=namespace,
                body=dict(manifest),
                timeout=timeout,
            )
        except BackendError as exc:
            cause = exc.__cause__
            if exist_ok and isinstance(cause, KubeHTTPError) and cause.status == 409:
                return False
            raise
        return True

    async def delete_secrets(
        self, namespace: str, selector: str, *, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        """Delete every Secret matching ``selector`` (one request)."""
        await self._request(
            "DELETE",
            f"/api/v1/namespaces/{namespace}/secrets",
            what=f"delete Secrets {selector} in {namespace}",
            query=[("labelSelector", selector)],
            timeout=timeout,
        )

    async def delete_jobs(
        self, namespace: str, selector: str, *, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        """Delete every Job matching ``selector`` (one request); pods follow in the background."""
        await self._request(
            "DELETE",
            f"/apis/batch/v1/namespaces/{namespace}/jobs",
            what=f"delete Jobs {selector} in {namespace}",
            query=[("labelSelector", selector)],
            body={"propagationPolicy": "Background", "gracePeriodSeconds": 0},
            timeout=timeout,
        )

    async def delete_pods(
        self,
        namespace: str,
        selector: str,
        *,
        grace: int = 0,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        """Delete every pod matching ``selector`` (one request): at once by default (a
        job's runner is PID 1 and ignores SIGTERM, so a graceful stop would only wait out
        the grace period); ``grace`` seconds after SIGTERM for a process that handles it
        (a pool's worker writes its buffered outcomes)."""
        await self._request(
            "DELETE",
            f"/api/v1/namespaces/{namespace}/pods",
            what=f"delete pods {selector} in {namespace}",
            query=[("labelSelector", selector)],
            body={"gracePeriodSeconds": grace},
            timeout=timeout,
        )

    async def get_job(
        self, namespace: str, name: str, *, timeout: float = DEFAULT_TIMEOUT
    ) -> dict[str, Any] | None:
        """The Job's JSON, or None when it does not exist."""
        result: dict[str, Any] | None = await self._request(
            "GET",
            f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}",
            what=f"get Job {namespace}/{name}",
            timeout=timeout,
        )
        return result

    async def delete_job(
        self, namespace: str, name: str, *, timeout: float = DEFAULT_TIMEOUT
    ) -> bool:
        """Delete a Job and, in the foreground, its pods. False when it did not exist."""
        result = await self._request(
            "DELETE",
            f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}",
            what=f"delete Job {namespace}/{name}",
            body={"propagationPolicy": "Foreground", "gracePeriodSeconds": 0},
            timeout=timeout,
        )
        return result is not None

    async def list_objects(
        self,
        kind: str,
        namespace: str,
        selector: str,
        *,
        field_selector: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> dict[str, Any]:
        """A list of ``kind`` (``jobs``, ``pods``, ``events``): ``items`` + ``metadata``.

        :raises ConfigError: the namespace does not exist (for ``jobs``).
        """
        query: list[tuple[str, Any]] = []
        if selector:
            query.append(("labelSelector", selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        result = await self._request(
            "GET",
            _collection(kind, namespace),
            what=f"list {kind} in {namespace}",
            query=query,
            timeout=timeout,
        )
        return result or {"items": [], "metadata": {}}

    async def read_namespace(
        self, namespace: str, *, timeout: float = DEFAULT_TIMEOUT
    ) -> dict[str, Any] | None:
        """The namespace object, or None when it does not exist."""
        result: dict[str, Any] | None = await self._request(
            "GET",
            f"/api/v1/namespaces/{namespace}",
            what=f"get namespace {namespace}",
            timeout=timeout,
        )
        return result

    async def get(self, path: str, *, what: str, timeout: float = DEFAULT_TIMEOUT) -> Any:
        """GET any API path (diagnostics: ``kinetic doctor``); its JSON, or None on 404.

        :raises ConfigError: the Kubernetes configuration cannot be loaded.
        :raises BackendError: refused, failed or unreachable within ``timeout``.
        """
        return await self._request("GET", path, what=what, timeout=timeout)

    async def pod_log(
        self,
        namespace: str,
        pod: str,
        *,
        tail: int | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> str | None:
        """The pod's container log, or None when the pod (or its log) is not there."""
        query: list[tuple[str, Any]] = []
        if tail is not None:
            query.append(("tailLines", tail))
        try:
            result: str | None = await self._request(
                "GET",
                f"/api/v1/namespaces/{namespace}/pods/{pod}/log",
                what=f"read log of pod {namespace}/{pod}",
                query=query,
                timeout=timeout,
                raw=True,
            )
        except BackendError as exc:
            # 400: the container has not started (or the pod is being torn down).
            if isinstance(exc.__cause__, KubeHTTPError) and exc.__cause__.status == 400:
                return None
            raise
        return result

    async def stream(
        self,
        path: str,
        *,
        what: str,
        query: list[tuple[str, Any]],
        read_timeout: float | None,
        connect_timeout: float = DEFAULT_TIMEOUT,
    ) -> AsyncIterator[bytes]:
        """Open a long-lived response (watch, followed log) and yield its chunks.

        Connecting is bounded by ``connect_timeout``; once open, a silence longer
        than ``read_timeout`` ends the stream with BackendError. Not retried: the
        caller decides how to resume.

        :raises KubeHTTPError: the server answered with an error status (410 Gone
            for a watch is the caller's business).
        :raises BackendError: connection failure or timeout.
        """
        _, _, http = await self._connection()

        async def opening() -> aiohttp.ClientResponse:
            return await self._open(
                "GET", path, what=what, query=query, read_timeout=read_timeout, total=None
            )

        async with http.streaming(what, opening, timeout=connect_timeout) as resp:
            async for chunk in resp.content.iter_any():
                yield chunk

    async def aclose(self) -> None:
        """Close the connection pool. Idempotent; shielded from cancellation."""
        self._closed = True
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()


def _query_value(value: Any) -> str:
    """A query parameter as the API server reads it (``true``, not Python's ``True``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _collection(kind: str, namespace: str) -> str:
    if kind == "jobs":
        return f"/apis/batch/v1/namespaces/{namespace}/jobs"
    if kind in ("pods", "events"):
        return f"/api/v1/namespaces/{namespace}/{kind}"
    raise ValueError(f"unsupported kind {kind!r}")


def collection_path(kind: str, namespace: str) -> str:
    """The API path listing ``kind`` in ``namespace`` (``jobs``, ``pods``, ``events``)."""
    return _collection(kind, namespace)
