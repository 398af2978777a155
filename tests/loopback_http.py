"""A loopback HTTP server on 127.0.0.1 that runs one handler function per request,
for the services that have no emulator (Cloud Build, the Container, IAM, Artifact
Registry and Resource Manager APIs, a registry's token service): the fakes in
``tests/fix_google.py`` and beside the tests speak their wire format through it, and
Kinetic's own clients reach them over real sockets, as they reach Google.

* :func:`serve` runs the server in the running event loop (async tests; a handler may
  then await the test's own clients, GCS on fake-gcs-server say); :func:`serve_in_thread`
  runs it on a loop of its own in a thread (sync tests whose code under test runs its
  own loops: the CLI).
* Each name in ``hosts`` gets a port of its own, and the handler sees that name as the
  request's host (``request.host``, ``request.url.host``): one fake can serve several
  API roots, told apart as Google's are, by host.
* A handler returns an answer (:func:`reply`, or any ``aiohttp.web.Response``), or
  :data:`BREAK` for a transport fault: the answer breaks off mid-body and the
  connection closes (the client sees a reset, which its retries must mend).
* What a handler raises (a failed ``assert`` about the request) is answered with HTTP
  500 and raised again where the server stops, so that the test fails with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json as jsonlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from multidict import CIMultiDictProxy
from yarl import URL

__all__ = ["BREAK", "Loopback", "Request", "reply", "serve", "serve_in_thread"]


@dataclass(frozen=True)
class Request:
    """What a handler sees of one request (its body read whole)."""

    method: str
    url: URL = field(repr=True)
    headers: CIMultiDictProxy[str] = field(repr=False)
    content: bytes = field(repr=False)

    @property
    def host(self) -> str:
        return self.url.host or ""

    @property
    def path(self) -> str:
        return self.url.path

    @property
    def params(self) -> dict[str, str]:
        return dict(self.url.query)

    def json(self) -> Any:
        return jsonlib.loads(self.content) if self.content else None


class _Break:
    def __repr__(self) -> str:
        return "BREAK"


BREAK: Any = _Break()
"""A handler's answer that breaks off: headers, a few bytes of a longer body, then the
connection closes."""

Answer = web.Response | _Break
Handler = Callable[[Request], Awaitable[Answer] | Answer]


def reply(
    status: int = 200,
    *,
    json: Any = None,
    text: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """An answer: ``json`` (serialised), else ``text``, else an empty body."""
    if json is not None:
        return web.Response(
            status=status,
            body=jsonlib.dumps(json).encode(),
            content_type="application/json",
            headers=headers,
        )
    return web.Response(status=status, text=text or "", headers=headers)


@dataclass
class Loopback:
    """A running server: :attr:`urls` maps each host name to its root
    (``http://127.0.0.1:PORT``); :attr:`url` is the first one's."""

    urls: dict[str, str]

    @property
    def url(self) -> str:
        return next(iter(self.urls.values()))


@contextlib.asynccontextmanager
async def serve(handler: Handler, *hosts: str) -> AsyncIterator[Loopback]:
    """Serve ``handler`` on 127.0.0.1 in the running loop, a port per name in
    ``hosts`` (default one, named ``loopback``), until the block ends."""
    names = hosts or ("loopback",)
    by_port: dict[int, str] = {}
    raised: list[Exception] = []

    async def dispatch(request: web.Request) -> web.StreamResponse:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        name = by_port.get(sockname[1] if sockname else 0, names[0])
        seen = Request(
            request.method,
            request.url.with_host(name),
            request.headers,
            await request.read(),
        )
        try:
            answer = handler(seen)
            if inspect.isawaitable(answer):
                answer = await answer
        except Exception as exc:  # noqa: BLE001 - raised again where the server stops
            raised.append(exc)
            return web.Response(status=500, text=f"the test's handler raised {exc!r}")
        if isinstance(answer, _Break):
            return await _break_off(request)
        assert isinstance(answer, web.Response), answer
        return _fresh(answer)

    app = web.Application(client_max_size=64 * 1024**2)
    app.router.add_route("*", "/{tail:.*}", dispatch)
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    try:
        urls: dict[str, str] = {}
        for name in names:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[-1][1]  # this site's
            by_port[port] = name
            urls[name] = f"http://127.0.0.1:{port}"
        yield Loopback(urls)
    finally:
        await runner.cleanup()
    if raised:
        raise raised[0]


def _fresh(answer: web.Response) -> web.Response:
    """A copy of ``answer`` not sent yet: a fake may give one answer several times."""
    sent = ("Content-Length", "Date", "Server")
    headers = {k: v for k, v in answer.headers.items() if k not in sent}
    return web.Response(
        status=answer.status, reason=answer.reason, body=answer.body, headers=headers
    )


async def _break_off(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
    resp.content_length = 1024
    await resp.prepare(request)
    await resp.write(b'{"broken": ')
    if request.transport is not None:
        request.transport.close()
    return resp


@contextlib.contextmanager
def serve_in_thread(handler: Handler, *hosts: str) -> Iterator[Loopback]:
    """:func:`serve` on an event loop of its own, in a thread, until the block ends
    (the handler runs on that thread); what the handler raised is raised here then."""
    ready: list[Loopback] = []
    failed: list[BaseException] = []
    started = threading.Event()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def main() -> None:
        async with serve(handler, *hosts) as server:
            ready.append(server)
            started.set()
            await stop.wait()

    def run() -> None:
        try:
            loop.run_until_complete(main())
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            failed.append(exc)
        finally:
            started.set()
            loop.close()

    thread = threading.Thread(target=run, name="loopback-http", daemon=True)
    thread.start()
    started.wait(30)
    try:
        if not ready:
            raise RuntimeError(f"the loopback server did not start: {failed}")
        yield ready[0]
    finally:
        with contextlib.suppress(RuntimeError):  # its loop ended already
            loop.call_soon_threadsafe(stop.set)
        thread.join(30)
    if failed:
        raise failed[0]
