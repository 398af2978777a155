"""Reaching one Kubernetes API server: the kubeconfig read, TLS built, a session opened.

Theory of operation
-------------------
:func:`load_endpoint` finds the configuration as ``kubectl`` does (the files of
``$KUBECONFIG``, merged, else ``~/.kube/config``, else a pod's service account),
applies the pure rules of :mod:`kinetic._core.kubeconfig`, reads the CA and client certificate
files, builds the ``ssl.SSLContext`` and decides whether the session may consult
the environment (proxies, netrc). All of that is blocking, so it runs in one worker
thread, never on the event loop. The result, an :class:`Endpoint`, is immutable and
shared; each event loop opens its own ``aiohttp`` session from it
(:meth:`Endpoint.open_session`) and presents its own
:class:`~kinetic._backends.gke.credentials.Credentials` per request (an
:class:`Auth`: headers, and the TLS context carrying a client certificate).

Errors: anything wrong with the configuration or its files is
:class:`~kinetic.ConfigError`, naming the file.
"""

from __future__ import annotations

import contextlib

# ssl encodes the server's host name with the idna codec on each TLS connection; the
# codec's module (and stringprep) would be imported by the first one, on the event
# loop. Imported with this module instead (which the backend's first use imports in a
# worker thread: kinetic._engine.preload).
import encodings.idna  # noqa: F401
import os
import ssl
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import anyio.to_thread

from kinetic._core import kubeconfig
from kinetic._core.kube_context import choose_context
from kinetic._core.kubeconfig import KubeTarget, Pem
from kinetic._exceptions import ConfigError
from kinetic._net import (
    tls_closing_connector,
    trust_context,
    trust_env_needed,
    verifying_context,
)
from kinetic._version import __version__

USER_AGENT = f"kinetic/{__version__}"


@dataclass(frozen=True)
class Auth:
    """What one request presents: its headers (``Authorization``) and the TLS
    context to connect with (it holds the client certificate, if any)."""

    headers: Mapping[str, str] = field(repr=False)
    ssl: ssl.SSLContext = field(repr=False)


@dataclass(frozen=True)
class Endpoint:
    """An API server as the configuration describes it; built by :func:`load_endpoint`.

    :ivar target: the resolved configuration (server, credentials' sources).
    :ivar source: the kubeconfig file it came from (several merged: joined with
        ``os.pathsep``, as in ``KUBECONFIG``), or None (in-cluster).
    :ivar ssl: the TLS context without an exec plugin's client certificate.
    :ivar ca_data: the CA's PEM bytes (for an exec plugin's cluster info), or None.
    :ivar trust_env: whether sessions consult proxy variables and netrc
        (:func:`kinetic._net.trust_env_needed`).
    """

    target: KubeTarget
    source: str | None
    ssl: ssl.SSLContext = field(repr=False)
    ca_data: bytes | None = field(repr=False)
    trust_env: bool = False

    def url(self, path: str) -> str:
        """The absolute URL of an API ``path`` (``/api/v1/...``)."""
        return self.target.server + path

    def options(self, auth: Auth) -> dict[str, Any]:
        """The TLS and proxy keywords of an aiohttp request carrying ``auth``."""
        options: dict[str, Any] = {
            "ssl": auth.ssl,
            "server_hostname": self.target.tls_server_name,
        }
        if self.target.proxy_url:
            options["proxy"] = self.target.proxy_url
        return options

    def open_session(self) -> aiohttp.ClientSession:
        """A new session for this server. Call it inside the loop that will use it;
        close it there. Requests pass their own timeouts; the session sets none."""
        return aiohttp.ClientSession(
            connector=tls_closing_connector(ssl=self.ssl),
            trust_env=self.trust_env,
            cookie_jar=aiohttp.DummyCookieJar(),  # the API server's answers set none we need
            headers={"User-Agent": USER_AGENT},
            timeout=aiohttp.ClientTimeout(total=None),
        )


async def load_endpoint(
    *,
    kubeconfig_path: str | None = None,
    context: str | None = None,
    cluster_context: str | None = None,
    context_override: str | None = None,
) -> Endpoint:
    """Read the configuration (in a worker thread) and build the endpoint.

    :param kubeconfig_path: an explicit file (or a list like ``KUBECONFIG``'s, merged);
        default the files of ``$KUBECONFIG``, merged, then ``~/.kube/config``, then the
        in-cluster service account.
    :param context: the context to use; default the one :func:`choose_context`
        picks for ``cluster_context``/``context_override``, else the current one.
    :raises ConfigError: no configuration, or one that cannot be used (the message
        names the file and what is wrong).

    Cancellation: the caller may give up (its deadline); the worker thread then
    finishes on its own (a file system that hangs holds a thread, not the loop).
    """
    return await anyio.to_thread.run_sync(
        _load,
        kubeconfig_path,
        context,
        cluster_context,
        context_override,
        abandon_on_cancel=True,
    )


def locate(explicit: str | None, env: Mapping[str, str], home: Path) -> list[str] | None:
    """The kubeconfig files to read and merge, or None for the in-cluster service
    account. Blocking (checks that the default file exists)."""
    if explicit:
        return [path for path in explicit.split(os.pathsep) if path] or [explicit]
    paths = kubeconfig.config_paths(env, str(home))
    if (
        not env.get("KUBECONFIG")
        and env.get("KUBERNETES_SERVICE_HOST")
        and not os.path.exists(paths[0])
    ):
        return None
    return paths


def read_kubeconfig(paths: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """The merged kubeconfig of ``paths`` (:func:`kinetic._core.kubeconfig.merge`) and
    the files it came from: those that exist, as ``kubectl`` skips the others. Blocking.

    :raises ConfigError: none of the files exists, or one cannot be read or parsed (the
        message names it).
    """
    documents: list[tuple[str, dict[str, Any]]] = []
    for path in paths:
        try:
            text = Path(path).read_bytes()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise ConfigError(f"cannot read the kubeconfig {path}: {exc}") from exc
        try:
            documents.append((path, kubeconfig.parse(text)))
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from exc
    if not documents:
        where = paths[0] if len(paths) == 1 else f"any of {', '.join(paths)}"
        raise ConfigError(
            f"no kubeconfig at {where}: set KUBECONFIG, or run `gcloud container clusters "
            "get-credentials CLUSTER --zone ZONE --project PROJECT`"
        )
    return kubeconfig.merge(documents), [path for path, _ in documents]


def _load(
    explicit: str | None,
    context: str | None,
    cluster_context: str | None,
    context_override: str | None,
) -> Endpoint:
    paths = locate(explicit, os.environ, Path.home())
    if paths is None:
        target = kubeconfig.in_cluster(os.environ)
        return _endpoint(target, None)
    config, sources = read_kubeconfig(paths)
    source = os.pathsep.join(sources)
    try:
        if context is None and (cluster_context or context_override):
            names, current = kubeconfig.list_contexts(config)
            context = choose_context(cluster_context, context_override, names, current)
        # Every relative path is absolute by now (merge); the directory is a formality.
        target = kubeconfig.resolve(config, os.path.dirname(os.path.abspath(sources[0])), context)
        return _endpoint(target, source)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc


def _endpoint(target: KubeTarget, source: str | None) -> Endpoint:
    ca = read_pem(target.ca, "certificate authority")
    cert = read_pem(target.client_cert, "client certificate")
    key = read_pem(target.client_key, "client key")
    return Endpoint(
        target=target,
        source=source,
        ssl=ssl_context(ca, insecure=target.insecure, cert=cert, key=key),
        ca_data=ca,
        trust_env=trust_env_needed(),
    )


def read_pem(pem: Pem | None, what: str) -> bytes | None:
    """The bytes of ``pem``, read from its file if it names one. Blocking.

    :raises ConfigError: the file cannot be read.
    """
    if pem is None:
        return None
    if pem.data is not None:
        return pem.data
    assert pem.path is not None
    try:
        return Path(pem.path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} file {pem.path}: {exc}") from exc


def ssl_context(
    ca: bytes | None, *, insecure: bool, cert: bytes | None = None, key: bytes | None = None
) -> ssl.SSLContext:
    """A client TLS context: trusting ``ca`` only (else Kinetic's one trust
    configuration, :func:`kinetic._net.trust_context`: the shared context itself when
    there is nothing to add to it), or nothing at all when ``insecure``; presenting
    ``cert``/``key`` (PEM) when given. Blocking.

    :raises ConfigError: the CA, certificate or key is not usable PEM.
    """
    if insecure:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif ca is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies, checks host names
        try:
            context.load_verify_locations(cadata=ca.decode("ascii", errors="replace"))
        except ssl.SSLError as exc:
            raise ConfigError(f"the certificate authority is not a PEM certificate: {exc}") from exc
    elif cert is None or key is None:
        return trust_context()
    else:
        context = verifying_context()
    if cert is not None and key is not None:
        # ssl loads certificates only from files: a private, short-lived copy.
        with _private_file(cert) as cert_path, _private_file(key) as key_path:
            try:
                context.load_cert_chain(cert_path, key_path)
            except ssl.SSLError as exc:
                raise ConfigError(
                    f"the client certificate and key are not a usable PEM pair: {exc}"
                ) from exc
    return context


@contextlib.contextmanager
def _private_file(data: bytes) -> Iterator[str]:
    fd, path = tempfile.mkstemp(prefix="kinetic-tls-")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
