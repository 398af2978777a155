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

**One trust configuration.** Every TLS connection Kinetic verifies with the system's
trust store (the Kubernetes API, GCS, Google's token endpoint, and every REST client of
the one HTTP edge, :mod:`kinetic._http`: Cloud Build, Artifact Registry and other
registries, the Container, IAM and GCS admin APIs) uses one ``ssl.SSLContext``,
:func:`trust_context`, built once per process. It trusts what OpenSSL's own convention
says: ``SSL_CERT_FILE`` and/or ``SSL_CERT_DIR`` when set (a company's TLS-inspecting
proxy CA, a private registry's), else the system's store. (A second HTTP stack once
trusted certifi's bundle instead: behind a proxy whose CA is in the system store, GCS
and Kubernetes worked while Cloud Build and the registry failed.) A cluster's own CA
(kubeconfig) and client certificates are per-cluster contexts
(:mod:`kinetic._backends.gke.endpoint`), built on :func:`verifying_context` when the
kubeconfig names no CA.
"""

from __future__ import annotations

import functools
import os
import ssl
import sys
import urllib.request
from collections.abc import Mapping
from typing import Any

import aiohttp
import aiohttp.helpers

from kinetic._exceptions import ConfigError

# Newer interpreters end such connections themselves; aiohttp then warns the flag is moot.
NEEDS_CLEANUP_CLOSED = sys.version_info < (3, 12, 7)


def tls_closing_connector(**options: Any) -> aiohttp.TCPConnector:
    """A ``TCPConnector`` (``options`` as aiohttp's) that aborts closed TLS connections,
    verifying with :func:`trust_context` unless ``options`` name an ``ssl``. Call it
    inside the running loop that will use it (after the first :func:`trust_context`
    call, which blocks, was made in a worker thread)."""
    options.setdefault("ssl", trust_context())
    return aiohttp.TCPConnector(enable_cleanup_closed=NEEDS_CLEANUP_CLOSED, **options)


def trust_locations(env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """``(cafile, capath)`` from ``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` (empty: unset);
    ``(None, None)`` means the system's store. Pure."""
    return env.get("SSL_CERT_FILE") or None, env.get("SSL_CERT_DIR") or None


def verifying_context() -> ssl.SSLContext:
    """A new client context that verifies certificates and host names against the one
    trust configuration (module docstring); for a caller that adds to it (a client
    certificate). Blocking: loads the CA files (tens of ms).

    :raises ConfigError: ``SSL_CERT_FILE`` or ``SSL_CERT_DIR`` names nothing usable.
    """
    cafile, capath = trust_locations(os.environ)
    if cafile is None and capath is None:
        return ssl.create_default_context()
    try:
        return ssl.create_default_context(cafile=cafile, capath=capath)
    except (OSError, ssl.SSLError) as exc:
        named = " and ".join(
            f"{name}={value}"
            for name, value in (("SSL_CERT_FILE", cafile), ("SSL_CERT_DIR", capath))
            if value
        )
        raise ConfigError(f"cannot load the trusted certificates of {named}: {exc}") from None


@functools.cache
def trust_context() -> ssl.SSLContext:
    """The process's shared verifying context (:func:`verifying_context`, built on the
    first call; never modified afterwards), for every aiohttp connector. Blocking on
    the first call only. ``trust_context.cache_clear()`` makes the next call read
    ``SSL_CERT_FILE``/``SSL_CERT_DIR`` again (tests).

    :raises ConfigError: as :func:`verifying_context`.
    """
    return verifying_context()


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
