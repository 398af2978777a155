"""The dashboard (``kinetic dashboard``): a page per job and batch, served on loopback.

    http.py      a small HTTP/1.1 server on anyio streams (GET, POST, server-sent events)
    app.py       routes and access: the token, the Host, a POST's origin, the confirm step
    pages.py     the HTML, the SVG chart and the page's one small script (pure)
    progress.py  what is known of a batch: states, counts, samples, failures (pure)
    source.py    the reads, through the async core, bounded per refresh

The public side is :mod:`kinetic.dashboard` (``serve``, ``run``, ``Dashboard``).
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass

import anyio
import anyio.abc
import anyio.to_thread
from anyio.abc import SocketAttribute

from kinetic._core.exception_groups import one_error
from kinetic._dashboard.app import App
from kinetic._dashboard.http import serve_connection
from kinetic._dashboard.source import Source
from runner.peer import Gate

HOST = "127.0.0.1"
log = logging.getLogger("kinetic")


@dataclass(frozen=True)
class Dashboard:
    """A running dashboard: where it listens and the token its URL carries."""

    port: int
    token: str
    storage_url: str

    @property
    def url(self) -> str:
        """The URL to open (with the token)."""
        return f"http://{HOST}:{self.port}/?t={self.token}"


async def serve(
    *,
    port: int = 0,
    token: str | None = None,
    backend: str | None = None,
    project: str | None = None,
    zone: str | None = None,
    cluster: str | None = None,
    namespace: str | None = None,
    task_status: anyio.abc.TaskStatus[Dashboard] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the dashboard on ``127.0.0.1:port`` (0: a free port) until cancelled.

    Start it in a task group with ``dashboard = await tg.start(serve)`` to learn its
    :class:`Dashboard` (URL and token); cancel the group's scope to stop it. Settings
    resolve as for ``kinetic.run`` (argument, ``KINETIC_*``, profile).

    :param token: the token the URL must carry (default: 32 random bytes, URL-safe).
    :raises ConfigError: for invalid settings.
    :raises OSError: when the port cannot be bound.
    """
    from kinetic._engine.remote import _listing_target  # where `kinetic jobs list` reads

    target = await _listing_target(project, zone, cluster, namespace, backend)
    token = token or secrets.token_urlsafe(32)
    listener = await anyio.create_tcp_listener(local_host=HOST, local_port=port)
    # Followers never raise (BatchWatch._follow); the listener's errors reach the caller
    # as themselves.
    with one_error():
        async with listener, anyio.create_task_group() as followers:
            await _serve(listener, Source(target, followers), token, task_status)


async def _serve(
    listener: anyio.abc.Listener[anyio.abc.SocketStream],
    source: Source,
    token: str,
    task_status: anyio.abc.TaskStatus[Dashboard],
) -> None:
    bound = int(listener.extra(SocketAttribute.local_port))
    app = App(source, token, bound)
    # Any local user may connect to a loopback port: only ours are answered, the token
    # is then checked as well (runner.peer reads the socket's owner).
    gate = Gate("dashboard", log.warning)

    async def connection(stream: anyio.abc.SocketStream) -> None:
        sock = stream.extra(SocketAttribute.raw_socket)
        if not await anyio.to_thread.run_sync(gate.admit, sock):
            await stream.aclose()
            return
        await serve_connection(stream, app.handle)

    task_status.started(Dashboard(bound, token, source.storage_url))
    await listener.serve(connection)
