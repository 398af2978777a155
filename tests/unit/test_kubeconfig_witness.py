"""Kinetic's kubeconfig loader against an independent witness: kubernetes-asyncio's.

A corpus of kubeconfig shapes (credentials of each kind, CA and client certificates as
data and as relative files, ``insecure-skip-tls-verify``, ``tls-server-name``,
``proxy-url``, an exec plugin, and ``KUBECONFIG`` lists that kubectl merges) is
written to files and resolved by both loaders, each through its public entry point
with ``KUBECONFIG`` set: Kinetic's ``load_endpoint`` and ``Credentials``, and
kubernetes-asyncio's ``KubeConfigMerger`` + ``KubeConfigLoader``. Both must resolve
the same server, ``Authorization`` header, CA, verification, TLS server name, client
certificate and key, and proxy.

Where the witness departs from kubectl, the corpus stays out of its way and
``test_kubeconfig.py`` checks kubectl's documented rule instead: with several files
setting ``current-context`` kubernetes-asyncio keeps the *last* (kubectl the first);
and it resolves a user's relative certificate paths against the *cluster's* file
(kubectl: the user's own file).
"""

from __future__ import annotations

import base64
import json
import os
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kinetic._backends.gke.credentials import Credentials
from kinetic._backends.gke.endpoint import load_endpoint, read_pem
from tests.unit.test_kube_tls import Issued, issue, make_ca

kube_config = pytest.importorskip("kubernetes_asyncio.config.kube_config")
kube_client = pytest.importorskip("kubernetes_asyncio.client")

V1 = "client.authentication.k8s.io/v1"
PLUGIN = """\
#!{python}
import json
print(json.dumps({{"apiVersion": "{version}", "kind": "ExecCredential",
                  "status": {{"token": "from-the-plugin"}}}}))
"""


@dataclass(frozen=True)
class Pki:
    ca: Issued
    client: Issued


@pytest.fixture(scope="module")
def pki() -> Pki:
    ca, key, cert = make_ca("witness CA")
    return Pki(ca=ca, client=issue(key, cert, "witness-user", server=False))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def one(cluster: dict[str, Any], user: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
        **extra,
    }


@dataclass
class Case:
    """Files (relative path -> document, or bytes for a plain file), the KUBECONFIG
    list (relative paths; one that is never written is a missing file), a context."""

    files: Callable[[Pki, Path], dict[str, Any]]
    kubeconfig: list[str] = field(default_factory=lambda: ["config"])
    context: str | None = None


def _plugin(where: Path) -> str:
    path = where / "bin" / "kube-plugin"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(PLUGIN.format(python=sys.executable, version=V1))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _merged_pair(pki: Pki, _: Path) -> dict[str, Any]:
    # Two files, as `KUBECONFIG=a/config:missing:b/config`: the context and its user in
    # the first, the cluster (with a CA file relative to *its* file) in the second; the
    # second's same-named user and cluster are discarded, its own context is usable.
    return {
        "a/config": {
            "current-context": "x",
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "users": [{"name": "u", "user": {"token": "from-a"}}],
        },
        "b/pki/ca.crt": pki.ca.cert,
        "b/config": {
            "clusters": [
                {
                    "name": "c",
                    "cluster": {"server": "https://b:6443", "certificate-authority": "pki/ca.crt"},
                },
                {"name": "d", "cluster": {"server": "http://127.0.0.1:8001"}},
            ],
            "users": [
                {"name": "u", "user": {"token": "from-b"}},
                {"name": "v", "user": {"username": "bee", "password": "pw"}},
            ],
            "contexts": [
                {"name": "x", "context": {"cluster": "d", "user": "v"}},
                {"name": "y", "context": {"cluster": "d", "user": "v"}},
            ],
        },
    }


def _first_cluster_wins(pki: Pki, _: Path) -> dict[str, Any]:
    second = one({"server": "https://second:6443", "tls-server-name": "second"}, {"token": "2"})
    del second["current-context"]
    return {
        "first": one(
            {"server": "https://first:6443", "certificate-authority-data": b64(pki.ca.cert)},
            {"token": "1"},
        ),
        "second": second,
    }


CORPUS: dict[str, Case] = {
    "token and CA data": Case(
        lambda p, _: {
            "config": one(
                {
                    "server": "https://api.example:6443",
                    "certificate-authority-data": b64(p.ca.cert),
                },
                {"token": "t0k"},
            )
        }
    ),
    "tokenFile and CA file, relative": Case(
        lambda p, _: {
            "config": one(
                {"server": "https://api.example", "certificate-authority": "pki/ca.crt"},
                {"tokenFile": "secrets/token"},
            ),
            "pki/ca.crt": p.ca.cert,
            "secrets/token": b"from-a-file",
        }
    ),
    "basic auth, insecure": Case(
        lambda p, _: {
            "config": one(
                {"server": "https://10.0.0.1:6443", "insecure-skip-tls-verify": True},
                {"username": "admin", "password": "s3cret"},
            )
        }
    ),
    "client certificate as data, tls-server-name": Case(
        lambda p, _: {
            "config": one(
                {
                    "server": "https://127.0.0.1:6443/",
                    "certificate-authority-data": b64(p.ca.cert),
                    "tls-server-name": "kube.test",
                },
                {
                    "client-certificate-data": b64(p.client.cert),
                    "client-key-data": b64(p.client.key),
                },
            )
        }
    ),
    "client certificate as relative files": Case(
        lambda p, _: {
            "kube/config": one(
                {"server": "https://h:443", "certificate-authority": "ca.crt"},
                {"client-certificate": "me/cert.pem", "client-key": "me/key.pem"},
            ),
            "kube/ca.crt": p.ca.cert,
            "kube/me/cert.pem": p.client.cert,
            "kube/me/key.pem": p.client.key,
        },
        kubeconfig=["kube/config"],
    ),
    "plain http, anonymous": Case(
        lambda p, _: {"config": one({"server": "http://127.0.0.1:8080"}, {})}
    ),
    "proxy-url": Case(
        lambda p, _: {
            "config": one(
                {
                    "server": "https://api.example:6443",
                    "certificate-authority-data": b64(p.ca.cert),
                    "proxy-url": "http://proxy.internal:3128",
                },
                {"token": "t"},
            )
        }
    ),
    "exec plugin": Case(
        lambda p, where: {
            "config": one(
                {"server": "https://api.example", "certificate-authority-data": b64(p.ca.cert)},
                {"exec": {"apiVersion": V1, "command": _plugin(where), "args": []}},
            )
        }
    ),
    "KUBECONFIG list: the first file's entries, a missing file skipped": Case(
        _merged_pair, kubeconfig=["a/config", "missing/config", "b/config"]
    ),
    "KUBECONFIG list: a context of the second file": Case(
        _merged_pair, kubeconfig=["a/config", "b/config"], context="y"
    ),
    "KUBECONFIG list: the first file's cluster of a shared name": Case(
        _first_cluster_wins, kubeconfig=["first", "second"]
    ),
}


def _write(case: Case, pki: Pki, where: Path) -> str:
    for rel, content in case.files(pki, where).items():
        path = where / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(json.dumps(content))
    return os.pathsep.join(str(where / rel) for rel in case.kubeconfig)


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


async def _ours(context: str | None) -> dict[str, Any]:
    endpoint = await load_endpoint(context=context)
    auth = await Credentials(endpoint).auth()
    target = endpoint.target
    return {
        "server": target.server,
        "authorization": auth.headers.get("Authorization"),
        "ca": endpoint.ca_data,
        "verify": not target.insecure,
        "tls_server_name": target.tls_server_name,
        "client_cert": read_pem(target.client_cert, "client certificate"),
        "client_key": read_pem(target.client_key, "client key"),
        "proxy": target.proxy_url,
    }


async def _witness(listed: str, context: str | None, scratch: Path) -> dict[str, Any]:
    merger = kube_config.KubeConfigMerger(listed)
    loader = kube_config.KubeConfigLoader(
        config_dict=merger.config,
        config_base_path=None,  # each entry relative to its own file, as the merger records
        active_context=context,
        temp_file_path=str(scratch),
    )
    configuration = kube_client.Configuration()
    await loader.load_and_set(configuration)
    return {
        "server": configuration.host,
        "authorization": configuration.api_key.get("BearerToken"),
        "ca": _read(configuration.ssl_ca_cert),
        "verify": configuration.verify_ssl,
        "tls_server_name": configuration.tls_server_name,
        "client_cert": _read(configuration.cert_file),
        "client_key": _read(configuration.key_file),
        "proxy": configuration.proxy,
    }


@pytest.mark.parametrize("name", list(CORPUS))
async def test_both_loaders_resolve_the_same_target(
    name: str, pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = CORPUS[name]
    listed = _write(case, pki, tmp_path / "home")
    monkeypatch.setenv("KUBECONFIG", listed)
    ours = await _ours(case.context)
    witness = await _witness(listed, case.context, tmp_path / "witness-scratch")
    assert ours == witness
