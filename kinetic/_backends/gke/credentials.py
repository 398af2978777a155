"""Who a request to the API server says it is: tokens, basic auth, exec plugins.

Theory of operation
-------------------
A :class:`Credentials` turns an :class:`~kinetic._backends.gke.endpoint.Endpoint`'s
user into an :class:`~kinetic._backends.gke.endpoint.Auth` per request, by the first
of these the kubeconfig names:

* ``tokenFile`` (and the in-cluster service account token): the file is re-read at
  least every :data:`TOKEN_FILE_TTL` seconds, since bound tokens rotate;
* ``token``, or ``username``/``password`` (basic): fixed for the process;
* an ``exec`` plugin: run (:func:`run_plugin`) when there is no credential yet or
  the last one is near its expiry (:func:`kinetic._core.exec_credential.refresh_at`);
  concurrent callers wait for one run (a lock). A certificate it returns goes into
  a TLS context of its own, built in a worker thread;
* nothing: anonymous (a client certificate in the TLS context may still identify).

A request the API server answers with 401 calls :meth:`Credentials.invalidate`: a
credential that can change (file, plugin) is dropped and the request may be sent
once more. A static one cannot change, so the 401 stands.

One :class:`Credentials` belongs to one event loop (its lock does);
:meth:`Credentials.for_another_loop` gives another loop its own, starting from the
credential already obtained.

Errors: a plugin that is missing, fails, times out (:data:`EXEC_TIMEOUT`) or prints
something unusable, and an unreadable token file, are :class:`~kinetic.ConfigError`.
"""

from __future__ import annotations

import base64
import os
import ssl
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import anyio
import anyio.to_thread

# anyio loads its subprocess support on first use: at import time here, not on the loop.
from anyio import run_process

from kinetic._backends.gke.endpoint import Auth, Endpoint, ssl_context
from kinetic._core import exec_credential
from kinetic._core.exec_credential import ExecCredential
from kinetic._core.kubeconfig import ExecSpec
from kinetic._exceptions import ConfigError

TOKEN_FILE_TTL = 60.0
"""Seconds a token read from a file is used before the file is read again."""
EXEC_TIMEOUT = 60.0
"""Seconds an exec plugin may run (it may refresh a cloud login over the network)."""


@dataclass(frozen=True)
class _Held:
    """A credential in use, and until when (either clock; None: no limit)."""

    auth: Auth
    until_monotonic: float | None = None
    until_wall: datetime | None = None

    def fresh(self) -> bool:
        if self.until_monotonic is not None and time.monotonic() >= self.until_monotonic:
            return False
        # An exec credential's expiry is a wall-clock instant stated by the plugin.
        return self.until_wall is None or datetime.now(UTC) < self.until_wall


class Credentials:
    """The credentials of ``endpoint``'s user, on the current event loop.

    :param exec_timeout: seconds an exec plugin may run.
    """

    def __init__(self, endpoint: Endpoint, *, exec_timeout: float = EXEC_TIMEOUT) -> None:
        self.endpoint = endpoint
        self.exec_timeout = exec_timeout
        target = endpoint.target
        self._lock = anyio.Lock()
        self._held: _Held | None = None
        self._static: Auth | None = None
        if target.token_file:
            self.kind = "tokenFile"
        elif target.token:
            self.kind = "token"
            self._static = self._auth({"Authorization": f"Bearer {target.token}"})
        elif target.username or target.password:
            self.kind = "basic"
            pair = f"{target.username or ''}:{target.password or ''}".encode()
            self._static = self._auth({"Authorization": f"Basic {base64.b64encode(pair).decode()}"})
        elif target.exec is not None:
            self.kind = "exec"
        else:
            self.kind = "none"
            self._static = self._auth({})

    def __repr__(self) -> str:
        return f"Credentials({self.kind}, server={self.endpoint.target.server!r})"

    @property
    def refreshable(self) -> bool:
        """Whether a new credential may differ from the current one (file, plugin)."""
        return self._static is None

    def for_another_loop(self) -> Credentials:
        """A copy for another event loop, starting from the credential held now."""
        other = Credentials(self.endpoint, exec_timeout=self.exec_timeout)
        other._held = self._held
        return other

    async def auth(self) -> Auth:
        """The credential to present now, obtaining a new one when needed.

        :raises ConfigError: the token file cannot be read, or the exec plugin is
            missing, fails, runs longer than ``exec_timeout`` or prints no credential.

        Cancellation: a plugin run is killed; the next caller starts another.
        """
        if self._static is not None:
            return self._static
        held = self._held
        if held is not None and held.fresh():
            return held.auth
        async with self._lock:
            held = self._held
            if held is None or not held.fresh():
                held = self._held = await self._obtain()
            return held.auth

    def invalidate(self, auth: Auth) -> bool:
        """The API server refused ``auth`` (401): drop it if it is still the one held.

        :returns: whether asking again may give another credential (a retry is
            worth it); False for static ones.
        """
        if not self.refreshable:
            return False
        if self._held is not None and self._held.auth is auth:
            self._held = None
        return True

    # -- obtaining --------------------------------------------------------------------

    def _auth(self, headers: dict[str, str]) -> Auth:
        return Auth(headers=headers, ssl=self.endpoint.ssl)

    async def _obtain(self) -> _Held:
        target = self.endpoint.target
        if target.token_file:
            # A hung file system holds a thread, not the caller past its deadline.
            token = await anyio.to_thread.run_sync(
                _read_token, target.token_file, abandon_on_cancel=True
            )
            return _Held(
                self._auth({"Authorization": f"Bearer {token}"}),
                until_monotonic=time.monotonic() + TOKEN_FILE_TTL,
            )
        assert target.exec is not None
        info = exec_credential.cluster_info(target, self.endpoint.ca_data)
        obtained = datetime.now(UTC)
        credential = await run_plugin(target.exec, info, timeout=self.exec_timeout)
        headers = {"Authorization": f"Bearer {credential.token}"} if credential.token else {}
        context = self.endpoint.ssl
        if credential.client_cert and credential.client_key:
            # From data in memory: bounded work, no file system or network to wait on.
            context = await anyio.to_thread.run_sync(self._exec_tls, credential)
        return _Held(
            Auth(headers=headers, ssl=context),
            until_wall=exec_credential.refresh_at(credential, obtained),
        )

    def _exec_tls(self, credential: ExecCredential) -> ssl.SSLContext:
        target = self.endpoint.target
        return ssl_context(
            self.endpoint.ca_data,
            insecure=target.insecure,
            cert=credential.client_cert,
            key=credential.client_key,
        )


async def run_plugin(
    spec: ExecSpec, cluster: dict[str, object] | None, *, timeout: float
) -> ExecCredential:
    """Run the exec plugin ``spec`` once and read the credential it prints.

    It runs without a terminal (empty stdin, ``interactive: false``), with this
    process's environment plus the entry's ``env`` and ``KUBERNETES_EXEC_INFO``.

    :raises ConfigError: the command is missing or not executable, exits non-zero,
        runs longer than ``timeout`` seconds (it is killed), or prints no usable
        ExecCredential; the message names the command, its exit status, the end of
        its stderr and the entry's ``installHint``.
    """
    env = exec_credential.plugin_environment(
        os.environ, spec, exec_credential.exec_info(spec, cluster)
    )
    try:
        with anyio.fail_after(timeout):
            done = await run_process([spec.command, *spec.args], input=b"", env=env, check=False)
    except TimeoutError:
        raise ConfigError(
            exec_credential.failure_message(
                spec, returncode=None, stderr=b"", reason=f"did not finish within {timeout}s"
            )
        ) from None
    except OSError as exc:
        reason = "was not found" if isinstance(exc, FileNotFoundError) else f"cannot run: {exc}"
        raise ConfigError(
            exec_credential.failure_message(spec, returncode=None, stderr=b"", reason=reason)
        ) from exc
    if done.returncode != 0:
        raise ConfigError(
            exec_credential.failure_message(spec, returncode=done.returncode, stderr=done.stderr)
        )
    return exec_credential.parse_credential(done.stdout, spec)


def _read_token(path: str) -> str:
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the token file {path}: {exc}") from exc
    if not token:
        raise ConfigError(f"the token file {path} is empty")
    return token
