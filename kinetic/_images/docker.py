"""Docker Engine API (over its unix socket) and registry v2 API, with httpx.

Only what building the runner image needs: ``POST /build`` (network off), ``POST
/images/{name}/push``, and the registry's ``GET /v2/{name}/manifests/{tag}`` to
ask whether a tag exists. Both progress streams are JSON lines; an ``error``
line fails the operation. Every failure becomes :class:`~kinetic.BackendError`
(httpx exceptions never escape), and every call takes a timeout.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import httpx

from kinetic._exceptions import BackendError, ConfigError

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


async def _json_lines(resp: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    async for line in resp.aiter_lines():
        if line.strip():
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if isinstance(item, dict):
                yield item


class DockerEngine:
    """A client of one Docker daemon's Engine API."""

    def __init__(self, docker_host: str | None = None) -> None:
        self.socket = docker_socket(docker_host)

    def _client(self, timeout: float) -> httpx.AsyncClient:
        transport = httpx.AsyncHTTPTransport(uds=self.socket)
        return httpx.AsyncClient(
            transport=transport, base_url="http://docker", timeout=httpx.Timeout(timeout)
        )

    async def build(self, context: bytes, tag: str, *, timeout: float = BUILD_TIMEOUT) -> str:
        """Build ``context`` (a tar with a Dockerfile) as ``tag``, network off; return the log.

        :raises BackendError: the build failed (the message ends with its log) or the
            daemon could not be reached.
        """
        params = {"t": tag, "networkmode": "none", "rm": "1", "forcerm": "1", "pull": "0"}
        output: list[str] = []
        try:
            async with (
                self._client(timeout) as client,
                client.stream(
                    "POST",
                    "/build",
                    params=params,
                    content=context,
                    headers={"Content-Type": "application/x-tar"},
                ) as resp,
            ):
                if resp.status_code != 200:
                    body = (await resp.aread()).decode(errors="replace")
                    raise BackendError(
                        f"docker build of {tag} refused: HTTP {resp.status_code} {body}"
                    )
                async for item in _json_lines(resp):
                    if "stream" in item:
                        output.append(str(item["stream"]))
                    if "error" in item:
                        log = "".join(output)[-4000:]
                        raise BackendError(f"docker build of {tag} failed: {item['error']}\n{log}")
        except httpx.HTTPError as exc:
            raise BackendError(f"docker build of {tag}: {type(exc).__name__}: {exc}") from exc
        return "".join(output)

    async def push(self, image: str, *, timeout: float = PUSH_TIMEOUT) -> None:
        """Push ``repository:tag`` to its registry.

        :raises BackendError: the push failed or the daemon could not be reached.
        """
        name, _, tag = image.rpartition(":")
        auth = base64.urlsafe_b64encode(b"{}").decode()
        try:
            async with (
                self._client(timeout) as client,
                client.stream(
                    "POST",
                    f"/images/{name}/push",
                    params={"tag": tag},
                    headers={"X-Registry-Auth": auth},
                ) as resp,
            ):
                if resp.status_code != 200:
                    body = (await resp.aread()).decode(errors="replace")
                    raise BackendError(
                        f"docker push of {image} refused: HTTP {resp.status_code} {body}"
                    )
                async for item in _json_lines(resp):
                    if "error" in item:
                        raise BackendError(f"docker push of {image} failed: {item['error']}")
        except httpx.HTTPError as exc:
            raise BackendError(f"docker push of {image}: {type(exc).__name__}: {exc}") from exc


class Registry:
    """A registry's v2 API (anonymous). Loopback registries are spoken to over http."""

    def __init__(self, host: str) -> None:
        self.host = host
        local = host.startswith(("127.", "localhost", "[::1]"))
        self.base = f"{'http' if local else 'https'}://{host}"

    async def has_tag(self, name: str, tag: str, *, timeout: float = QUERY_TIMEOUT) -> bool:
        """Whether ``name:tag`` exists (``GET /v2/NAME/manifests/TAG``).

        :raises BackendError: the registry answered neither 200 nor 404, or is unreachable.
        """
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(timeout)) as client:
                resp = await client.get(
                    f"{self.base}/v2/{name}/manifests/{tag}", headers={"Accept": _MANIFEST_TYPES}
                )
        except httpx.HTTPError as exc:
            raise BackendError(f"registry {self.host}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code == 200:
            return True
        if resp.status_code == 404:
            return False
        raise BackendError(
            f"registry {self.host}: GET manifest {name}:{tag} answered HTTP {resp.status_code}"
        )
