"""aiohttp connections that are closed for good when their session closes.

Before Python 3.12.7 a TLS connection that aiohttp closes (a watch given up half-read,
a websocket the pod ended, a download cut short) first waits for the server to answer
its TLS close, up to 30 s, with the socket open. When the event loop ends before that
(``asyncio.run`` returning, the debug forward's loop stopping), the socket is left to
the garbage collector: an ``unclosed socket`` ResourceWarning, and a file descriptor
held until then. aiohttp's ``enable_cleanup_closed`` aborts such connections when the
session closes (and any still waiting after 2 s); every session Kinetic opens uses it.
"""

from __future__ import annotations

import sys
from typing import Any

import aiohttp

# Newer interpreters end such connections themselves; aiohttp then warns the flag is moot.
NEEDS_CLEANUP_CLOSED = sys.version_info < (3, 12, 7)


def tls_closing_connector(**options: Any) -> aiohttp.TCPConnector:
    """A ``TCPConnector`` (``options`` as aiohttp's) that aborts closed TLS connections.
    Call it inside the running loop that will use it."""
    return aiohttp.TCPConnector(enable_cleanup_closed=NEEDS_CLEANUP_CLOSED, **options)


def close_tls_firmly(api: Any) -> Any:
    """``api`` (a kubernetes-asyncio ``ApiClient``), with its connector set as
    :func:`tls_closing_connector` sets one.

    kubernetes-asyncio builds its connector with no way to pass the option, so the
    connector's flag is set on it and its periodic clean-up started (which also keeps
    the list of closed connections from growing in a long-lived process); where this
    aiohttp has neither, nothing changes. Call it inside the loop that will use ``api``.
    """
    session = getattr(api.rest_client, "pool_manager", None)
    connector: Any = getattr(session, "connector", None)
    if (
        NEEDS_CLEANUP_CLOSED
        and getattr(connector, "_cleanup_closed_disabled", False) is True
        and callable(getattr(connector, "_cleanup_closed", None))
    ):
        connector._cleanup_closed_disabled = False
        connector._cleanup_closed()
    return api
