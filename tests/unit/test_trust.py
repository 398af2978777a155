"""One trust configuration for every HTTP client (kinetic._net.trust_context), for real:
a loopback HTTPS server (aiohttp.web on 127.0.0.1) whose certificate a private CA made
here signed, reached by the Kubernetes client (a kubeconfig without a CA: "the system's
trust", its endpoint's own session) and by a REST client of Kinetic's HTTP edge (the
Container API client, kinetic._http's session).

Both must trust the CA exactly when ``SSL_CERT_FILE``/``SSL_CERT_DIR`` say so (OpenSSL's
convention: both variables, else the system's store), and through one context built
once.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from kinetic import ConfigError, KineticError
from kinetic._backends.gke.client import KubeClient
from kinetic._backends.gke.endpoint import load_endpoint, ssl_context
from kinetic._infra.container import ContainerClient
from kinetic._net import tls_closing_connector, trust_context, trust_locations
from tests.unit.test_kube_tls import Issued, _name, _pem, make_ca


def _server_cert(ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage([x509.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        # Python 3.13's default contexts verify strictly (VERIFY_X509_STRICT): they
        # want the issuer's key identifier.
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return _pem(cert, key)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Files: the private CA, another CA, the server's certificate and key, and a
    hashed CA directory (OpenSSL's ``c_rehash`` layout) holding the private CA."""
    where = tmp_path_factory.mktemp("pki")
    ca, ca_key, ca_cert = make_ca("kinetic private CA")
    other, _, _ = make_ca("some other CA")
    server = _server_cert(ca_key, ca_cert)
    files = {
        "ca": where / "ca.pem",
        "other": where / "other.pem",
        "cert": where / "server.pem",
        "key": where / "server.key",
        "dir": where / "hashed",
    }
    files["ca"].write_bytes(ca.cert)
    files["other"].write_bytes(other.cert)
    files["cert"].write_bytes(server.cert)
    files["key"].write_bytes(server.key)
    files["dir"].mkdir()
    openssl = shutil.which("openssl")
    if openssl is not None:
        digest = subprocess.run(
            [openssl, "x509", "-hash", "-noout", "-in", str(files["ca"])],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        (files["dir"] / f"{digest}.0").write_bytes(ca.cert)
    return files


@pytest.fixture
def trust_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No trust variables, and a trust context rebuilt from them on the next use."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    trust_context.cache_clear()
    yield monkeypatch
    trust_context.cache_clear()


@pytest.fixture
async def server(pki: dict[str, Path]) -> AsyncIterator[str]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki["cert"], pki["key"])

    async def version(request: web.Request) -> web.Response:
        return web.json_response({"gitVersion": "v1.30.0-trust"})

    async def anything(request: web.Request) -> web.Response:
        return web.json_response({"error": {"code": 404, "message": "no such cluster"}}, status=404)

    app = web.Application()
    app.router.add_get("/version", version)
    app.router.add_route("*", "/{tail:.*}", anything)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"https://{host}:{port}"
    finally:
        await runner.cleanup()


def _kubeconfig(where: Path, server: str) -> Path:
    path = where / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "clusters": [{"name": "c", "cluster": {"server": server}}],  # no CA
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


async def _token() -> str:
    return "ya29.test"


async def _both(server: str, where: Path) -> tuple[object, object]:
    """The Kubernetes client's and the REST client's answers (or the error each raised)."""
    results: list[object] = []
    client = KubeClient(kubeconfig=str(_kubeconfig(where, server)), attempts=1)
    try:
        results.append(
            (await client.get("/version", what="get /version", timeout=20))["gitVersion"]
        )
    except KineticError as exc:
        results.append(exc)
    finally:
        await client.aclose()
    container = ContainerClient(
        _token, project="p", location="us-central1-a", base_url=server, attempts=1
    )
    try:
        results.append(await container.get_cluster("kn"))
    except KineticError as exc:
        results.append(exc)
    finally:
        await container.aclose()
    return results[0], results[1]


def test_trust_locations_are_openssls_variables() -> None:
    assert trust_locations({}) == (None, None)
    assert trust_locations({"SSL_CERT_FILE": "", "SSL_CERT_DIR": ""}) == (None, None)
    assert trust_locations({"SSL_CERT_FILE": "/f", "SSL_CERT_DIR": "/d"}) == ("/f", "/d")


async def test_ssl_cert_file_serves_both_stacks(
    server: str, pki: dict[str, Path], trust_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    trust_env.setenv("SSL_CERT_FILE", str(pki["ca"]))
    assert await _both(server, tmp_path) == ("v1.30.0-trust", None)


async def test_both_variables_serve_both_stacks(
    server: str, pki: dict[str, Path], trust_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The CA is in the hashed directory only; the file holds another CA. OpenSSL reads
    # both (httpx, on its own, read SSL_CERT_FILE alone).
    if not any(pki["dir"].iterdir()):
        pytest.fail("openssl is needed to lay out a hashed CA directory")
    trust_env.setenv("SSL_CERT_FILE", str(pki["other"]))
    trust_env.setenv("SSL_CERT_DIR", str(pki["dir"]))
    assert await _both(server, tmp_path) == ("v1.30.0-trust", None)


async def test_without_the_variables_neither_stack_trusts_a_private_ca(
    server: str, trust_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    kube, container = await _both(server, tmp_path)
    assert isinstance(kube, KineticError), kube
    assert isinstance(container, KineticError), container
    for error in (kube, container):
        assert "certificate" in str(error).lower(), error


async def test_one_context_built_once_serves_every_client(
    trust_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    shared = trust_context()
    assert trust_context() is shared
    # aiohttp: a connector's default, and a kubeconfig without a CA of its own.
    connector = tls_closing_connector()
    try:
        assert connector._ssl is shared
    finally:
        await connector.close()
    endpoint = await load_endpoint(kubeconfig_path=str(_kubeconfig(tmp_path, "https://h:1")))
    assert endpoint.ssl is shared
    # The REST clients' session (the Container API's here) verifies with the same context.
    container = ContainerClient(_token, project="p", location="l")
    try:
        session = await container._http.session()
        assert session.connector is not None
        assert session.connector._ssl is shared  # type: ignore[attr-defined]
    finally:
        await container.aclose()


def test_a_cluster_ca_or_a_client_certificate_gets_a_context_of_its_own(
    pki: dict[str, Path], trust_env: pytest.MonkeyPatch
) -> None:
    shared = trust_context()
    assert ssl_context(None, insecure=False) is shared
    assert ssl_context(pki["ca"].read_bytes(), insecure=False) is not shared
    assert ssl_context(None, insecure=True) is not shared


def test_unusable_trust_variables_are_a_config_error(
    trust_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    trust_env.setenv("SSL_CERT_FILE", str(tmp_path / "missing.pem"))
    with pytest.raises(ConfigError, match="SSL_CERT_FILE="):
        trust_context()
