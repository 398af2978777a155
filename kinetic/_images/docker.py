"""Docker Engine API (over its unix socket) and registry v2 API, through Kinetic's HTTP
edge (:mod:`kinetic._http`).

Only what building images needs: ``POST /build`` (network off, or the host's for the
index install path), ``POST
/images/{name}/push``, and the registry's ``GET /v2/{name}/manifests/{tag}`` to
ask whether a tag exists (with the registry token handshake where a registry asks
for it: Artifact Registry, Docker Hub). Both progress streams are JSON lines; an
``error`` line fails the operation. Every build or push failure becomes
:class:`~kinetic.ImageBuildError`, every registry query failure
:class:`~kinetic.BackendError` (aiohttp exceptions never escape), and every call takes
a timeout. Neither is retried: a build or push is not repeated behind the caller's back.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import anyio

from kinetic._exceptions import BackendError, ConfigError, ImageBuildError
from kinetic._http import HttpClient, Reply
from kinetic._images.builder import BUILD_TIMEOUT as BUILD_AND_PUSH_TIMEOUT
from kinetic._images.builder import Progress

BUILD_TIMEOUT = 900.0
PUSH_TIMEOUT = 600.0
QUERY_TIMEOUT = 30.0

_MANIFEST_TYPES = (
    "application/vnd.docker.distribution.manifest.v2+json, "
    "application/vnd.docker.distribution.manifest.list.v2+json, "
    "application/vnd.oci.image.manifest.v1+json, "
    "application/vnd.oci.image.index.v1+json"
)


def docker_socket(docker_host: str | None = None) -> str:
    """The Docker daemon's unix socket path from ``DOCKER_HOST`` (``unix://PATH``).

    :raises ConfigError: when DOCKER_HOST is not a unix socket.
    """
    host = docker_host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if not host.startswith("unix://"):
        raise ConfigError(f"DOCKER_HOST must be a unix socket (unix:///path), got {host!r}")
    return host.removeprefix("unix://")


async def _json_lines(resp: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of a progress stream, one a line (other lines skipped)."""
    rest = b""
    async for chunk in resp.content.iter_any():
        *lines, rest = (rest + chunk).split(b"\n")
        for line in lines:
            if (item := _json_object(line)) is not None:
                yield item
    if (item := _json_object(rest)) is not None:
        yield item


def _json_object(line: bytes) -> dict[str, Any] | None:
    try:
        item = json.loads(line) if line.strip() else None
    except ValueError:
        return None
    return item if isinstance(item, dict) else None


class DockerEngine:
    """A client of one Docker daemon's Engine API."""

    def __init__(self, docker_host: str | None = None) -> None:
        self.socket = docker_socket(docker_host)

    def _client(self, timeout: float) -> HttpClient:
        """A client of the daemon: plain HTTP over its socket, waiting at most
        ``timeout`` seconds for a connection or the next bytes; never retried."""
        return HttpClient(
            error=ImageBuildError,
            prefix="docker ",
            base_url="http://docker",
            unix_socket=self.socket,
            attempts=1,
            attempt_timeout=timeout,
        )

    @contextlib.asynccontextmanager
    async def _stream(
        self, what: str, path: str, *, timeout: float, **request: Any
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """The daemon's progress stream of ``POST path``.

        :raises ImageBuildError: the daemon could not be reached, refused (its answer
            named), or the stream broke off.
        """
        async with (
            self._client(timeout) as http,
            http.streaming(
                what, lambda: http.open("POST", path, **request), timeout=timeout
            ) as resp,
        ):
            if resp.status != 200:
                body = (await resp.read()).decode(errors="replace")
                raise ImageBuildError(f"docker {what} refused: HTTP {resp.status} {body}")
            yield resp

    async def build(
        self,
        context: bytes,
        tag: str,
        *,
        timeout: float = BUILD_TIMEOUT,
        progress: Progress | None = None,
        no_cache: bool = False,
        network: str = "none",
    ) -> str:
        """Build ``context`` (a tar with a Dockerfile) as ``tag``; return the log.

        :param no_cache: build every layer afresh (a cold build), ignoring the layer cache.
        :param network: the build's network mode: ``none`` (off), or ``host`` for a
            build that installs from the package index (a daemon started with
            ``--bridge=none`` has no other network that reaches it).

        :raises ImageBuildError: the build failed (the message ends with its log) or the
            daemon could not be reached.
        """
        params = {"t": tag, "networkmode": network, "rm": "1", "forcerm": "1", "pull": "0"}
        if no_cache:
            params["nocache"] = "1"
        output: list[str] = []
        async with self._stream(
            f"build of {tag}",
            "/build",
            timeout=timeout,
            params=params,
            data=io.BytesIO(context),  # aiohttp sends a large body in chunks
            headers={"Content-Type": "application/x-tar"},
        ) as resp:
            async for item in _json_lines(resp):
                if "stream" in item:
                    output.append(str(item["stream"]))
                    if progress is not None and str(item["stream"]).strip():
                        progress(str(item["stream"]).rstrip("\n"))
                if "error" in item:
                    log = "".join(output)[-4000:]
                    raise ImageBuildError(f"docker build of {tag} failed: {item['error']}\n{log}")
        return "".join(output)

    async def push(self, image: str, *, timeout: float = PUSH_TIMEOUT) -> None:
        """Push ``repository:tag`` to its registry.

        :raises ImageBuildError: the push failed or the daemon could not be reached.
        """
        name, _, tag = image.rpartition(":")
        auth = base64.urlsafe_b64encode(b"{}").decode()
        async with self._stream(
            f"push of {image}",
            f"/images/{name}/push",
            timeout=timeout,
            params={"tag": tag},
            headers={"X-Registry-Auth": auth},
        ) as resp:
            async for item in _json_lines(resp):
                if "error" in item:
                    raise ImageBuildError(f"docker push of {image} failed: {item['error']}")


Credentials = Callable[[], Awaitable[tuple[str, str] | None]]
"""Returns (username, password) for a registry's token service, or None (anonymous)."""

_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


class DockerBuilder:
    """:class:`~kinetic._images.builder.ImageBuilder` on a Docker daemon: build, then
    push. Layers of an earlier build are reused by the daemon's cache.

    :param install: ``wheels`` (the default: contexts carry the wheels, builds run with
        the network off) or ``index`` (builds install from the package index on the
        host's network).
    :param no_cache: build every layer afresh, ignoring the daemon's layer cache.
    """

    name = "docker"

    def __init__(
        self, docker_host: str | None = None, *, install: str = "wheels", no_cache: bool = False
    ) -> None:
        self.engine = DockerEngine(docker_host)
        self.install = install
        self.no_cache = no_cache

    async def build_and_push(
        self,
        context: bytes,
        image: str,
        *,
        progress: Progress | None = None,
        timeout: float = BUILD_AND_PUSH_TIMEOUT,
    ) -> None:
        try:
            with anyio.fail_after(timeout):
                network = "host" if self.install == "index" else "none"
                await self.engine.build(
                    context,
                    image,
                    timeout=timeout,
                    progress=progress,
                    network=network,
                    no_cache=self.no_cache,
                )
                await self.engine.push(image, timeout=timeout)
        except TimeoutError as exc:
            raise ImageBuildError(f"building and pushing {image} took over {timeout}s") from exc


class Registry:
    """A registry's v2 API. Loopback registries are spoken to over http.

    A registry that answers 401 with a ``Bearer`` challenge gets the standard token
    handshake (the token service named by the challenge, with ``credentials`` when
    given, else anonymously), once per instance; the token is then reused.
    """

    def __init__(self, host: str, *, credentials: Credentials | None = None) -> None:
        self.host = host
        local = host.startswith(("127.", "localhost", "[::1]"))
        self.base = f"{'http' if local else 'https'}://{host}"
        self._credentials = credentials
        self._token: str | None = None

    async def has_tag(self, name: str, tag: str, *, timeout: float = QUERY_TIMEOUT) -> bool:
        """Whether ``name:tag`` exists (``GET /v2/NAME/manifests/TAG``): one request when
        anonymous access or a held token suffices.

        :raises BackendError: the registry answered neither 200 nor 404 (after the token
            handshake), or is unreachable.
        """
        url = f"{self.base}/v2/{name}/manifests/{tag}"
        what = f"GET manifest {name}:{tag}"

        async def attempt(_: int) -> bool:
            reply = await http.send("GET", url, headers=self._headers())
            challenge = reply.headers.get("www-authenticate", "")
            if reply.status == 401 and "bearer" in challenge.lower():
                self._token = await self._fetch_token(http, challenge)
                reply = await http.send("GET", url, headers=self._headers())
            if reply.status in (200, 404):
                return reply.status == 200
            raise http.error(f"{what} answered HTTP {reply.status}")

        # One try: the caller asks again (its builds wait on the answer, not on retries).
        async with HttpClient(
            error=BackendError, prefix=f"registry {self.host}: ", attempts=1
        ) as http:
            return await http.call(what, attempt, timeout=timeout)

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": _MANIFEST_TYPES}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    async def _fetch_token(self, http: HttpClient, challenge: str) -> str:
        params = dict(_CHALLENGE.findall(challenge))
        realm = params.pop("realm", None)
        if not realm:
            raise BackendError(f"registry {self.host}: a Bearer challenge without a realm")
        creds = await self._credentials() if self._credentials else None
        headers = {}
        if creds:  # HTTP Basic (aiohttp's BasicAuth is deprecated)
            pair = base64.b64encode(":".join(creds).encode("latin-1")).decode()
            headers["Authorization"] = f"Basic {pair}"
        reply: Reply = await http.send("GET", realm, params=params, headers=headers)
        if reply.status != 200:
            raise BackendError(
                f"registry {self.host}: its token service {realm} answered HTTP "
                f"{reply.status}; check the credentials for this registry"
            )
        body = reply.json()
        token = body.get("token") or body.get("access_token")
        if not isinstance(token, str):
            raise BackendError(f"registry {self.host}: its token service returned no token")
        return token
