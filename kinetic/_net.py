"""aiohttp sessions as Kinetic wants them: TLS connections closed for good when their
session closes, and no per-request environment lookups that can find nothing.

Before Python 3.12.7 a TLS connection that aiohttp closes (a watch given up half-read,
a websocket the pod ended, a download cut short) first waits for the server to answer
its TLS close, up to 30 s, with the socket open. When the event loop ends before that
(``asyncio.run`` returning, the debug forward's loop stopping), the socket is left to
the garbage collector: an ``unclosed socket`` ResourceWarning, and a file descriptor
held until then. aiohttp's ``enable_cleanup_closed`` aborts such connections when the
session closes (and any still waiting after 2 s); every session Kinetic opens uses it.

A session opened with ``trust_env=True`` reads the proxy variables and ``~/.netrc``
for every request, in a worker thread of the loop's default executor (a thread hop
per request; and starting that executor's threads holds the loop until each has
started, tens of ms on a busy machine). :func:`trust_env_needed` says whether those
lookups can find anything at all.
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


def trust_env_needed() -> bool:
    """Whether a session should consult the environment (``trust_env``): True when a
    proxy variable for http(s)/ws(s) is set or a netrc file exists, else False (the
    lookups could only find nothing). Decided once per session: a proxy set later in
    this process is not seen by it. Blocking (reads the environment and looks for the
    netrc file): call it in a worker thread.
    """
    proxies = urllib.request.getproxies()
    if any(scheme in proxies for scheme in ("http", "https", "ws", "wss")):
        return True
    return aiohttp.helpers.netrc_from_env() is not None
