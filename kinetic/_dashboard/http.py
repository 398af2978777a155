"""A small HTTP/1.1 server on anyio streams, for the dashboard only.

Why not ``http.server``: it blocks a thread per connection and knows nothing of the
event loop the dashboard's reads run on; server-sent events would pin a thread each.
Why not a framework: the dashboard needs GET, one POST, and event streams on loopback;
a dependency for that is more code than this module. What it speaks:

* one request per connection (``Connection: close`` on every answer): no keep-alive,
  no pipelining, no chunked request bodies; a body only with ``Content-Length``, at
  most :data:`MAX_BODY` bytes;
* a request head of at most :data:`MAX_HEAD` bytes, read within :data:`HEAD_TIMEOUT`
  seconds (a slow or silent client is dropped, never waited on);
* an answer is a :class:`Response` (bytes), or an :class:`EventStream` (server-sent
  events) that lasts until its source ends or the client leaves.

Parsing is sans-IO (:func:`parse_head`, :func:`parse_form`); only :func:`serve_connection`
touches a stream. Every connection runs in the listener's task group: it has an owner
that cancels it when the server stops.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit

import anyio
import anyio.abc

MAX_HEAD = 16 * 1024
MAX_BODY = 64 * 1024
HEAD_TIMEOUT = 10.0
SEND_TIMEOUT = 30.0

_REASONS = {
    200: "OK",
    303: "See Other",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Payload Too Large",
    500: "Internal Server Error",
}


class BadRequest(Exception):
    """The bytes received are not a request this server takes (answered 400/413)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Request:
    """One parsed request. Header names are lower case."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes = b""

    def form(self) -> dict[str, str]:
        """The body as ``application/x-www-form-urlencoded`` (first value of each key)."""
        return parse_form(self.body)


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "text/html; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        head = [f"HTTP/1.1 {self.status} {_REASONS.get(self.status, 'Unknown')}"]
        fields = {
            "Content-Type": self.content_type,
            "Content-Length": str(len(self.body)),
            "Cache-Control": "no-store",
            "Connection": "close",
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "same-origin",  # the token is in the URL: never send it out
            "X-Frame-Options": "DENY",
            **self.headers,
        }
        head += [f"{k}: {v}" for k, v in fields.items()]
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + self.body


@dataclass
class EventStream:
    """Server-sent events: each item of ``events`` is (event name, JSON-able data)."""

    events: AsyncIterator[tuple[str, object]]

    HEAD = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
        b"Cache-Control: no-store\r\nConnection: close\r\nX-Accel-Buffering: no\r\n"
        b"Referrer-Policy: same-origin\r\n\r\n"
    )


def encode_event(name: str, data: object) -> bytes:
    """One server-sent event; the data as one line of JSON (no newline can split it)."""
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


Handler = Callable[[Request], Awaitable[Response | EventStream]]


def parse_head(head: bytes) -> tuple[str, str, dict[str, str], dict[str, str]]:
    """Method, path (percent-decoded), query (first value per key) and headers of a
    request head (without its final blank line).

    :raises BadRequest: for anything but an HTTP/1.x request line and headers.
    """
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError as exc:  # pragma: no cover - latin-1 decodes every byte
        raise BadRequest("undecodable head") from exc
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest("malformed request line")
    method, target, _ = parts
    if not target.startswith("/"):
        raise BadRequest("only origin-form request targets")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest("malformed header line")
        headers[name.lower()] = value.strip()
    split = urlsplit(target)
    query = {k: v[0] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
    return method, unquote(split.path), query, headers


def parse_form(body: bytes) -> dict[str, str]:
    """An urlencoded form body (first value of each key)."""
    text = body.decode("utf-8", errors="replace")
    return {k: v[0] for k, v in parse_qs(text, keep_blank_values=True).items()}


async def _read_request(stream: anyio.abc.ByteStream) -> Request:
    buf = b""
    with anyio.fail_after(HEAD_TIMEOUT):
        while b"\r\n\r\n" not in buf:
            if len(buf) > MAX_HEAD:
                raise BadRequest("request head too large", 413)
            try:
                buf += await stream.receive(4096)
            except anyio.EndOfStream:
                raise BadRequest("connection closed mid-request") from None
        head, _, rest = buf.partition(b"\r\n\r\n")
        if len(head) > MAX_HEAD:
            raise BadRequest("request head too large", 413)
        method, path, query, headers = parse_head(head)
        if "transfer-encoding" in headers:
            raise BadRequest("chunked request bodies are not taken")
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            raise BadRequest("bad Content-Length") from None
        if length < 0 or length > MAX_BODY:
            raise BadRequest("request body too large", 413)
        while len(rest) < length:
            try:
                rest += await stream.receive(4096)
            except anyio.EndOfStream:
                raise BadRequest("connection closed mid-body") from None
    return Request(method, path, query, headers, rest[:length])


async def serve_connection(stream: anyio.abc.ByteStream, handler: Handler) -> None:
    """Read one request from ``stream``, answer it with ``handler``, close the stream."""
    async with stream:
        try:
            request = await _read_request(stream)
        except BadRequest as exc:
            await _send(stream, Response(exc.status, f"{exc}\n".encode(), "text/plain"))
            return
        except (TimeoutError, anyio.BrokenResourceError, OSError):
            return
        try:
            answer = await handler(request)
        except Exception as exc:  # noqa: BLE001 - one failing page must not stop the server
            body = f"the dashboard could not answer: {type(exc).__name__}: {exc}\n"
            answer = Response(500, body.encode(), "text/plain; charset=utf-8")
        if isinstance(answer, Response):
            await _send(stream, answer)
            return
        try:
            with anyio.fail_after(SEND_TIMEOUT):
                await stream.send(EventStream.HEAD)
            async for name, data in answer.events:
                with anyio.fail_after(SEND_TIMEOUT):
                    await stream.send(encode_event(name, data))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, TimeoutError, OSError):
            return  # the client left
        finally:
            aclose = getattr(answer.events, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()


async def _send(stream: anyio.abc.ByteStream, response: Response) -> None:
    try:
        with anyio.fail_after(SEND_TIMEOUT):
            await stream.send(response.encode())
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, TimeoutError, OSError):
        return
