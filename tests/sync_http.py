"""A small blocking HTTP client for the tests' own stand-ins that run on threads (the
LeaderWorkerSet controller of ``test_pathways``, killing a container through the Docker
Engine): the standard library's ``http.client``, a connection per request (safe from
any thread), JSON in and out. Kinetic's own clients are async (``kinetic._http``)."""

from __future__ import annotations

import http.client
import json as jsonlib
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

__all__ = ["Answer", "SyncHttp"]

Errors = (OSError, http.client.HTTPException)
"""What a request may raise when the server cannot be reached or breaks off."""


@dataclass(frozen=True)
class Answer:
    status_code: int
    content: bytes

    def json(self) -> Any:
        return jsonlib.loads(self.content)

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise AssertionError(f"HTTP {self.status_code}: {self.content[:500]!r}")


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


class SyncHttp:
    """Requests to ``base_url`` (``http://`` or ``https://``, ``verify=False`` trusting
    any certificate), or over ``unix_socket``, each bounded by ``timeout`` seconds."""

    def __init__(
        self,
        base_url: str = "http://localhost",
        *,
        headers: Mapping[str, str] | None = None,
        unix_socket: str | None = None,
        verify: bool = True,
        timeout: float = 10.0,
    ) -> None:
        self._url = urlsplit(base_url)
        self._headers = dict(headers or {})
        self._unix_socket = unix_socket
        self._timeout = timeout
        self._ssl = ssl.create_default_context()
        if not verify:
            self._ssl.check_hostname = False
            self._ssl.verify_mode = ssl.CERT_NONE

    def _connection(self) -> http.client.HTTPConnection:
        if self._unix_socket is not None:
            return _UnixConnection(self._unix_socket, self._timeout)
        host, port = self._url.hostname or "localhost", self._url.port
        if self._url.scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=self._timeout, context=self._ssl)
        return http.client.HTTPConnection(host, port, timeout=self._timeout)

    def request(
        self, method: str, path: str, *, params: Mapping[str, str] | None = None, json: Any = None
    ) -> Answer:
        target = path + (f"?{urlencode(params)}" if params else "")
        headers = dict(self._headers)
        body = None
        if json is not None:
            body = jsonlib.dumps(json).encode()
            headers["Content-Type"] = "application/json"
        conn = self._connection()
        try:
            conn.request(method, target, body=body, headers=headers)
            resp = conn.getresponse()
            return Answer(resp.status, resp.read())
        finally:
            conn.close()

    def get(self, path: str, *, params: Mapping[str, str] | None = None) -> Answer:
        return self.request("GET", path, params=params)

    def post(
        self, path: str, *, params: Mapping[str, str] | None = None, json: Any = None
    ) -> Answer:
        return self.request("POST", path, params=params, json=json)
