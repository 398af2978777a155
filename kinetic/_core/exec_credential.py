"""The exec credential plugin protocol (``client.authentication.k8s.io``): pure rules.

Theory of operation
-------------------
A kubeconfig user with an ``exec`` entry gets its credentials from a command
(``gke-gcloud-auth-plugin`` on GKE). The client runs it with the environment of
:func:`plugin_environment`: its own, the entry's ``env``, and ``KUBERNETES_EXEC_INFO``,
an ``ExecCredential`` request saying the plugin may not prompt (``interactive:
false``) and, when the entry asks for it (``provideClusterInfo``), which cluster the
credential is for. The plugin prints an ``ExecCredential`` whose ``status`` holds a
bearer token and/or a client certificate and key, and optionally an
``expirationTimestamp``; :func:`parse_credential` reads it and :func:`refresh_at`
says until when it may be reused. Running the command, and the clock, belong to the
IO side (:mod:`kinetic._backends.gke.credentials`).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from kinetic._core.kubeconfig import ExecSpec, KubeTarget
from kinetic._exceptions import ConfigError

EXPIRY_MARGIN = timedelta(seconds=30)
"""A credential is renewed this long before it expires (a request must not carry a
token that expires on its way), or halfway through its life when that is shorter."""
STDERR_LINES = 5
"""Lines of a failing plugin's stderr quoted in the error."""


@dataclass(frozen=True)
class ExecCredential:
    """What a plugin returned: a token and/or a client certificate (PEM), and expiry.

    :ivar expires_at: timezone-aware; None when the plugin gave none (reused until
        the API server refuses it).
    """

    token: str | None = field(default=None, repr=False)
    client_cert: bytes | None = field(default=None, repr=False)
    client_key: bytes | None = field(default=None, repr=False)
    expires_at: datetime | None = None


def cluster_info(target: KubeTarget, ca_data: bytes | None) -> dict[str, object]:
    """The ``spec.cluster`` of the request (``provideClusterInfo``): the cluster as
    the kubeconfig describes it, the CA inlined whether it came as data or a file."""
    info: dict[str, object] = {"server": target.server}
    if ca_data:
        info["certificate-authority-data"] = base64.b64encode(ca_data).decode("ascii")
    if target.insecure:
        info["insecure-skip-tls-verify"] = True
    if target.tls_server_name:
        info["tls-server-name"] = target.tls_server_name
    if target.proxy_url:
        info["proxy-url"] = target.proxy_url
    return info


def exec_info(spec: ExecSpec, cluster: Mapping[str, object] | None) -> str:
    """``KUBERNETES_EXEC_INFO``: the ExecCredential request, as JSON.

    :param cluster: :func:`cluster_info`; included only when the entry sets
        ``provideClusterInfo``.
    """
    request_spec: dict[str, object] = {"interactive": False}
    if spec.provide_cluster_info and cluster is not None:
        request_spec["cluster"] = dict(cluster)
    return json.dumps(
        {"apiVersion": spec.api_version, "kind": "ExecCredential", "spec": request_spec},
        separators=(",", ":"),
    )


def plugin_environment(base: Mapping[str, str], spec: ExecSpec, info: str) -> dict[str, str]:
    """The plugin's environment: ``base`` (the client's), the entry's ``env`` on top,
    and ``KUBERNETES_EXEC_INFO``."""
    env = dict(base)
    env.update(spec.env)
    env["KUBERNETES_EXEC_INFO"] = info
    return env


def parse_credential(stdout: bytes | str, spec: ExecSpec) -> ExecCredential:
    """The ExecCredential a plugin printed.

    :raises ConfigError: not JSON, another kind or apiVersion than asked for, neither
        a token nor a certificate and key, or a malformed expiry.
    """
    what = f"exec plugin {spec.command!r}"
    try:
        doc = json.loads(stdout)
    except ValueError as exc:
        raise ConfigError(f"{what} printed no ExecCredential JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("kind") != "ExecCredential":
        raise ConfigError(f"{what} printed something other than an ExecCredential")
    if doc.get("apiVersion") != spec.api_version:
        raise ConfigError(
            f"{what} answered with apiVersion {doc.get('apiVersion')!r}; the kubeconfig "
            f"asked for {spec.api_version!r}"
        )
    status = doc.get("status")
    if not isinstance(status, dict):
        raise ConfigError(f"{what} printed an ExecCredential without a status")
    token = status.get("token") or None
    cert = status.get("clientCertificateData") or None
    key = status.get("clientKeyData") or None
    for name, value in (("token", token), ("clientCertificateData", cert), ("clientKeyData", key)):
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{what}: status.{name} is not a string")
    if (cert is None) != (key is None):
        raise ConfigError(f"{what} returned a client certificate without its key, or a key alone")
    if token is None and cert is None:
        raise ConfigError(f"{what} returned neither a token nor a client certificate")
    return ExecCredential(
        token=token,
        client_cert=cert.encode() if cert else None,
        client_key=key.encode() if key else None,
        expires_at=_timestamp(status.get("expirationTimestamp"), what),
    )


def refresh_at(credential: ExecCredential, obtained_at: datetime) -> datetime | None:
    """When ``credential`` (obtained at ``obtained_at``) must be replaced; None: never
    by the clock (only when the API server refuses it)."""
    expires = credential.expires_at
    if expires is None:
        return None
    life = expires - obtained_at
    return expires - min(EXPIRY_MARGIN, max(life, timedelta(0)) / 2)


def failure_message(
    spec: ExecSpec, *, returncode: int | None, stderr: bytes | str, reason: str | None = None
) -> str:
    """The error for a plugin that could not give a credential: the command, its exit
    status (or ``reason``: not found, timed out), the end of its stderr, and the
    entry's ``installHint``."""
    what = f"exec plugin {spec.command!r}"
    text = f"{what} {reason}" if reason else f"{what} exited with status {returncode}"
    if isinstance(stderr, bytes):
        stderr = stderr.decode(errors="replace")
    tail = [line for line in stderr.strip().splitlines() if line.strip()][-STDERR_LINES:]
    if tail:
        text += ": " + " | ".join(line.strip() for line in tail)
    if spec.install_hint:
        text += f"\n{spec.install_hint.strip()}"
    return text


def _timestamp(value: object, what: str) -> datetime | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{what}: status.expirationTimestamp is not a string")
    try:
        parsed = datetime.fromisoformat(value)  # RFC 3339 (with "Z") since Python 3.11
    except ValueError:
        raise ConfigError(
            f"{what}: status.expirationTimestamp {value!r} is not an RFC 3339 time"
        ) from None
    if parsed.tzinfo is None:
        raise ConfigError(f"{what}: status.expirationTimestamp {value!r} has no time zone")
    return parsed
