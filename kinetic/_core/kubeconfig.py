"""What a kubeconfig says about reaching a cluster: pure rules, no IO.

Theory of operation
-------------------
A kubeconfig (YAML, :func:`parse`) holds named ``clusters`` (where: server, CA,
TLS options), ``users`` (who: credentials) and ``contexts`` (a cluster, a user and
a namespace under one name); ``current-context`` names the one used by default.
:func:`resolve` turns one context into a :class:`KubeTarget`, a frozen value that
the IO side (:mod:`kinetic._backends.gke.credentials`) turns into TLS settings and
request headers. :func:`in_cluster` builds the same value for a pod's service
account. Nothing here reads a file: paths are resolved (relative ones against the
kubeconfig's directory, as ``kubectl`` does) and left for the IO side to read.

Several files (a ``KUBECONFIG`` list, :func:`config_paths`) are merged by
:func:`merge` as ``kubectl`` merges them (Kubernetes' documented rules): files that
do not exist and empty names are skipped; the first file to set a value or a map key
wins and is never changed: the first ``current-context``, and of two ``clusters``,
``users`` or ``contexts`` entries of one name, the first file's whole entry (none of
the second's fields are mixed in). Each file's relative paths are relative to that
file, so :func:`merge` makes them absolute before the files meet.

Supported: ``token``, ``tokenFile``, ``username``/``password`` (basic), client
certificates, ``exec`` credential plugins (``client.authentication.k8s.io/v1`` and
``v1beta1``; ``gke-gcloud-auth-plugin`` is one), CA data or file,
``insecure-skip-tls-verify``, ``tls-server-name`` and an http(s) ``proxy-url``.
Refused with :class:`~kinetic.ConfigError`: ``auth-provider`` (removed from the
Kubernetes clients), impersonation (``as``, ``as-groups``, ...), and everything a
kubeconfig cannot mean (missing entries, malformed base64).

Precedence, as in Kubernetes' own client: ``*-data`` over the file of the same
thing; ``tokenFile`` over ``token``; a token or basic credentials over ``exec``.
"""

from __future__ import annotations

import base64
import binascii
import os.path
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from kinetic._exceptions import ConfigError

EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
"""ExecCredential versions Kinetic speaks (v1alpha1 was removed from Kubernetes 1.24)."""

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_FILE = f"{SERVICE_ACCOUNT_DIR}/token"
CA_FILE = f"{SERVICE_ACCOUNT_DIR}/ca.crt"
NAMESPACE_FILE = f"{SERVICE_ACCOUNT_DIR}/namespace"

_IMPERSONATION = ("as", "as-uid", "as-groups", "as-user-extra")
_USER_PATHS = ("client-certificate", "client-key", "tokenFile")


@dataclass(frozen=True)
class Pem:
    """PEM material given inline (``data``) or as a file to read (``path``): exactly one."""

    data: bytes | None = field(default=None, repr=False)
    path: str | None = None

    def __repr__(self) -> str:  # never the bytes: they may be a private key
        return f"Pem(path={self.path!r})" if self.path else f"Pem(<{len(self.data or b'')} bytes>)"


@dataclass(frozen=True)
class ExecSpec:
    """A ``users[].user.exec`` entry: a command that prints an ExecCredential.

    :ivar command: absolute, bare (looked up on ``PATH``), or resolved against the
        kubeconfig's directory when it was relative with a directory part.
    :ivar env: variables added to the plugin's environment, in order.
    """

    api_version: str
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    provide_cluster_info: bool = False
    install_hint: str | None = None


@dataclass(frozen=True)
class KubeTarget:
    """One cluster as one user sees it: where to connect and what to present.

    :ivar server: the API server's base URL, without a trailing slash.
    :ivar context: the kubeconfig context it came from (None: in-cluster).
    :ivar namespace: the context's namespace, or None.
    :ivar ca: the CA to trust instead of the system's, or None.
    :ivar insecure: ``insecure-skip-tls-verify``: no verification of the server.
    :ivar tls_server_name: the name to verify the server's certificate against.
    :ivar proxy_url: an http(s) proxy for the API server, or None.
    :ivar client_cert: client certificate (with ``client_key``), or None.
    :ivar token: a static bearer token.
    :ivar token_file: a file holding the bearer token (re-read: it may rotate).
    :ivar exec: a credential plugin, or None.
    """

    server: str
    context: str | None = None
    namespace: str | None = None
    ca: Pem | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    proxy_url: str | None = None
    client_cert: Pem | None = None
    client_key: Pem | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    token_file: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    exec: ExecSpec | None = None


@dataclass(frozen=True)
class ContextRef:
    """A ``contexts[].context`` entry: the names it joins."""

    name: str
    cluster: str
    user: str | None
    namespace: str | None


def config_paths(env: Mapping[str, str], home: str) -> list[str]:
    """The kubeconfig files clients read, in order, as ``kubectl`` finds them: the
    non-empty entries of ``$KUBECONFIG`` (merged by :func:`merge`), else
    ``{home}/.kube/config``."""
    listed = [path for path in env.get("KUBECONFIG", "").split(os.pathsep) if path]
    return listed or [os.path.join(home, ".kube", "config")]


def config_path(env: Mapping[str, str], home: str) -> str:
    """The first of :func:`config_paths`: the file ``kubectl config`` would create."""
    return config_paths(env, home)[0]


def merge(files: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """One kubeconfig from the parsed documents of several files, ``(path, document)``
    in ``KUBECONFIG`` order (files that do not exist left out), by ``kubectl``'s
    rules (module docstring). Relative paths in each come out absolute, against its
    own file's directory. One file alone comes out with only its paths made absolute.

    :raises ConfigError: a document's ``clusters``, ``users`` or ``contexts`` is
        malformed (the message names the file).
    """
    merged: dict[str, Any] = {"clusters": [], "users": [], "contexts": []}
    for path, document in files:
        directory = os.path.dirname(os.path.abspath(path))
        try:
            for key, inner in (("clusters", "cluster"), ("users", "user"), ("contexts", "context")):
                known = {entry["name"] for entry in merged[key]}
                for name, body in _named(document, key, inner):
                    if name not in known:  # the first file's entry, whole
                        known.add(name)
                        merged[key].append({"name": name, inner: _absolute(inner, body, directory)})
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
        current = document.get("current-context")
        if current and "current-context" not in merged:
            merged["current-context"] = current
    return merged


def parse(text: str | bytes) -> dict[str, Any]:
    """The kubeconfig document in ``text`` (YAML; JSON is YAML); empty is ``{}``.

    :raises ConfigError: not YAML, or not a mapping.
    """
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built with it
    try:
        doc = yaml.load(text, Loader=loader)  # a safe loader: plain data only
    except yaml.YAMLError as exc:
        raise ConfigError(f"the kubeconfig is not valid YAML: {exc}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"the kubeconfig is a {type(doc).__name__}, not a mapping")
    return doc


def list_contexts(config: Mapping[str, Any]) -> tuple[list[str], str | None]:
    """The context names, in file order, and ``current-context`` (None: unset).

    The current context is returned as written, even when no context has that name
    (:func:`resolve` refuses it then).

    :raises ConfigError: ``contexts`` is not a list of named entries.
    """
    names = [name for name, _ in _named(config, "contexts", "context")]
    current = config.get("current-context")
    return names, (str(current) if current else None)


def context_ref(config: Mapping[str, Any], name: str | None) -> ContextRef:
    """Context ``name`` (None: ``current-context``).

    :raises ConfigError: no such context, no current context, or an entry without a
        cluster.
    """
    names, current = list_contexts(config)
    chosen = name or current
    if not chosen:
        raise ConfigError(
            f"the kubeconfig has no current-context (contexts: {', '.join(names) or 'none'}); "
            "choose one with `kubectl config use-context NAME`"
        )
    entry = _entries(config, "contexts", "context").get(chosen)
    if entry is None:
        raise ConfigError(
            f"the kubeconfig has no context {chosen!r} (it has: {', '.join(names) or 'none'})"
        )
    cluster = entry.get("cluster")
    if not cluster or not isinstance(cluster, str):
        raise ConfigError(f"kubeconfig context {chosen!r} names no cluster")
    user = entry.get("user")
    namespace = entry.get("namespace")
    return ContextRef(
        name=chosen,
        cluster=cluster,
        user=str(user) if user else None,
        namespace=str(namespace) if namespace else None,
    )


def resolve(config: Mapping[str, Any], directory: str, context: str | None = None) -> KubeTarget:
    """The target of ``context`` (None: the current context) in ``config``.

    :param directory: the kubeconfig file's directory: relative paths in it (CA,
        certificates, ``tokenFile``, an ``exec`` command with a directory part) are
        relative to it.
    :raises ConfigError: no such context; a context naming a cluster or user the file
        lacks; a cluster without ``server``; ``auth-provider``; impersonation; more
        than one kind of static credential; malformed base64 or exec settings; a CA
        together with ``insecure-skip-tls-verify`` (kubectl refuses that too).
    """
    ref = context_ref(config, context)
    cluster = _entries(config, "clusters", "cluster").get(ref.cluster)
    if cluster is None:
        raise ConfigError(
            f"kubeconfig context {ref.name!r} names cluster {ref.cluster!r}, "
            "which the kubeconfig does not define"
        )
    user: Mapping[str, Any] = {}
    if ref.user is not None:
        found = _entries(config, "users", "user").get(ref.user)
        if found is None:
            raise ConfigError(
                f"kubeconfig context {ref.name!r} names user {ref.user!r}, "
                "which the kubeconfig does not define"
            )
        user = found
    where = f"kubeconfig cluster {ref.cluster!r}"
    server = _text(cluster, "server", where)
    if not server:
        raise ConfigError(f"{where} has no server")
    if "://" not in server:
        server = "https://" + server  # a bare host[:port], as kubectl accepts it
    ca = _pem(cluster, "certificate-authority", directory, where)
    insecure = cluster.get("insecure-skip-tls-verify") is True
    if insecure and ca is not None:
        raise ConfigError(
            f"{where} sets both a certificate authority and insecure-skip-tls-verify; "
            "remove one (kubectl refuses this too)"
        )
    proxy_url = _text(cluster, "proxy-url", where)
    if proxy_url and not proxy_url.startswith(("http://", "https://")):
        raise ConfigError(
            f"{where}: proxy-url {proxy_url!r} is not an http(s) proxy (the only kind "
            "Kinetic supports)"
        )
    return KubeTarget(
        server=server.rstrip("/"),
        context=ref.name,
        namespace=ref.namespace,
        ca=ca,
        insecure=insecure,
        tls_server_name=_text(cluster, "tls-server-name", where),
        proxy_url=proxy_url,
        **_user(user, ref.user or "", directory),
    )


def in_cluster(env: Mapping[str, str]) -> KubeTarget:
    """The target of a pod's own service account: ``KUBERNETES_SERVICE_HOST`` and
    ``_PORT``, the mounted token (re-read by the IO side: bound tokens rotate) and CA.

    :raises ConfigError: the variables are unset (not running in a pod).
    """
    host = env.get("KUBERNETES_SERVICE_HOST", "").strip()
    port = env.get("KUBERNETES_SERVICE_PORT", "").strip()
    if not host or not port:
        raise ConfigError(
            "no kubeconfig, and not inside a cluster (KUBERNETES_SERVICE_HOST/PORT unset): "
            "set KUBECONFIG or run `gcloud container clusters get-credentials ...`"
        )
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address: a URL needs it bracketed
    return KubeTarget(server=f"https://{host}:{port}", ca=Pem(path=CA_FILE), token_file=TOKEN_FILE)


# --------------------------------------------------------------------------- helpers


def _named(config: Mapping[str, Any], key: str, inner: str) -> list[tuple[str, Mapping[str, Any]]]:
    items = config.get(key) or []
    if not isinstance(items, list):
        raise ConfigError(f"the kubeconfig's {key!r} is not a list")
    found: list[tuple[str, Mapping[str, Any]]] = []
    for item in items:
        if not isinstance(item, dict) or not item.get("name"):
            raise ConfigError(f"the kubeconfig's {key!r} has an entry without a name")
        body = item.get(inner) or {}
        if not isinstance(body, dict):
            raise ConfigError(f"kubeconfig {inner} {item['name']!r} is not a mapping")
        found.append((str(item["name"]), body))
    return found


def _entries(config: Mapping[str, Any], key: str, inner: str) -> dict[str, Mapping[str, Any]]:
    entries: dict[str, Mapping[str, Any]] = {}
    for name, body in _named(config, key, inner):
        entries.setdefault(name, body)  # the first of duplicate names, as kubectl
    return entries


def _text(entry: Mapping[str, Any], key: str, where: str) -> str | None:
    value = entry.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {key} must be a string, got {type(value).__name__}")
    return value


def _absolute(inner: str, body: Mapping[str, Any], directory: str) -> dict[str, Any]:
    """``body`` (a cluster, user or context) with its relative file paths made absolute
    against ``directory``, as ``kubectl`` resolves each file's paths before merging.
    Values of the wrong type are left for :func:`resolve` to refuse."""
    out = dict(body)
    keys = {"cluster": ("certificate-authority",), "user": _USER_PATHS}.get(inner, ())
    for key in keys:
        value = out.get(key)
        if isinstance(value, str) and value:
            out[key] = _path(directory, value)
    spec = out.get("exec") if inner == "user" else None
    if isinstance(spec, dict) and isinstance(spec.get("command"), str):
        command = spec["command"]
        if not os.path.isabs(command) and os.sep in command:  # as resolve() reads it
            out["exec"] = {**spec, "command": _path(directory, command)}
    return out


def _path(directory: str, path: str) -> str:
    return path if os.path.isabs(path) else os.path.normpath(os.path.join(directory, path))


def _pem(entry: Mapping[str, Any], key: str, directory: str, where: str) -> Pem | None:
    data = _text(entry, f"{key}-data", where)
    if data is not None:
        try:
            return Pem(data=base64.b64decode(data, validate=True))
        except (binascii.Error, ValueError):
            raise ConfigError(f"{where}: {key}-data is not valid base64") from None
    path = _text(entry, key, where)
    return Pem(path=_path(directory, path)) if path else None


def _user(user: Mapping[str, Any], name: str, directory: str) -> dict[str, Any]:
    where = f"kubeconfig user {name!r}"
    if user.get("auth-provider"):
        provider = user["auth-provider"]
        kind = provider.get("name") if isinstance(provider, dict) else None
        named = f" {kind!r}" if kind else ""
        raise ConfigError(
            f"{where} uses auth-provider{named}, which was removed from the Kubernetes "
            "clients (kubectl 1.26+). GKE needs "
            "gke-gcloud-auth-plugin, an exec plugin: `gcloud components install "
            "gke-gcloud-auth-plugin`, then `gcloud container clusters get-credentials ...` "
            "rewrites the entry"
        )
    used = [key for key in _IMPERSONATION if user.get(key)]
    if used:
        raise ConfigError(f"{where}: impersonation ({', '.join(used)}) is not supported")
    token = _text(user, "token", where)
    token_file = _text(user, "tokenFile", where)
    username = _text(user, "username", where)
    password = _text(user, "password", where)
    if (token or token_file) and (username or password):
        raise ConfigError(f"{where} has both a token and a username/password; only one is allowed")
    cert = _pem(user, "client-certificate", directory, where)
    key = _pem(user, "client-key", directory, where)
    if (cert is None) != (key is None):
        raise ConfigError(f"{where} has a client certificate without its key, or a key alone")
    spec = user.get("exec")
    return {
        "client_cert": cert,
        "client_key": key,
        "token": token,
        "token_file": _path(directory, token_file) if token_file else None,
        "username": username,
        "password": password,
        "exec": _exec(spec, where, directory) if spec else None,
    }


def _exec(spec: Any, where: str, directory: str) -> ExecSpec:
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: exec is not a mapping")
    version = spec.get("apiVersion")
    if version not in EXEC_API_VERSIONS:
        raise ConfigError(
            f"{where}: exec apiVersion {version!r} is not supported (use one of "
            f"{', '.join(EXEC_API_VERSIONS)})"
        )
    command = _text(spec, "command", where + " exec")
    if not command:
        raise ConfigError(f"{where}: exec has no command")
    if not os.path.isabs(command) and os.sep in command:
        command = _path(directory, command)  # relative with a directory part: the file's
    if spec.get("interactiveMode") == "Always":
        raise ConfigError(
            f"{where}: exec plugin {command!r} requires interactive mode, and Kinetic runs "
            "plugins without a terminal"
        )
    return ExecSpec(
        api_version=str(version),
        command=command,
        args=tuple(_strings(spec.get("args"), f"{where}: exec args")),
        env=tuple(_env(spec.get("env"), where)),
        provide_cluster_info=spec.get("provideClusterInfo") is True,
        install_hint=_text(spec, "installHint", where + " exec"),
    )


def _strings(value: Any, where: str) -> Sequence[str]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where} must be a list of strings")
    return value


def _env(value: Any, where: str) -> list[tuple[str, str]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{where}: exec env must be a list of {{name, value}}")
    pairs: list[tuple[str, str]] = []
    for item in value:
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("name"), str)
            or not item["name"]
            or not isinstance(item.get("value", ""), str)
        ):
            raise ConfigError(f"{where}: exec env entries need a name and a string value")
        pairs.append((item["name"], item.get("value", "")))
    return pairs
