"""aiohttp sessions as Kinetic wants them: TLS connections closed for good when their
session closes, and no per-request environment lookups that can find nothing.

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
import urllib.request
from typing import Any

import aiohttp
import aiohttp.helpers

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


def skip_empty_env_lookups(api: Any) -> Any:
    """``api`` (a kubernetes-asyncio ``ApiClient``), its session no longer looking up
    proxies and netrc credentials for each request where the environment has none.

    kubernetes-asyncio opens its session with ``trust_env=True``: aiohttp then reads the
    proxy variables and ``~/.netrc`` for every request, in a worker thread of the loop's
    default executor (a thread hop per request; and starting that executor's threads
    holds the loop until each has started, tens of ms on a busy machine). Where no proxy
    is configured and no netrc file exists, those lookups can only find nothing, so they
    are turned off; otherwise nothing changes (a proxy set later in this process is not
    seen by this client). Blocking (reads the environment and the netrc file): call it
    in a worker thread.
    """
    session: Any = getattr(api.rest_client, "pool_manager", None)
    if getattr(session, "_trust_env", None) is not True:
        return api
    proxies = urllib.request.getproxies()
    if any(scheme in proxies for scheme in ("http", "https", "ws", "wss")):
        return api
    if aiohttp.helpers.netrc_from_env() is not None:
        return api
    session._trust_env = False  # kubernetes-asyncio has no option for it
    return api
