"""TLS of the Kubernetes client, for real: a loopback HTTPS server (aiohttp.web on
127.0.0.1) with certificates from a private CA made here with ``cryptography``. The
server's certificate names only ``kube.test``, so verification needs the kubeconfig's
CA and ``tls-server-name``; it asks for a client certificate and reports whose it got.
"""

from __future__ import annotations

import base64
import datetime
import json
import ssl
import stat
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kinetic import BackendError, ConfigError
from kinetic._backends.gke.client import KubeClient

V1 = "client.authentication.k8s.io/v1"


@dataclass(frozen=True)
class Issued:
    cert: bytes  # PEM
    key: bytes  # PEM


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca(cn: str) -> tuple[Issued, ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _pem(cert, key), key, cert


def issue(
    ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate, cn: str, *, server: bool
) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [
                    x509.ExtendedKeyUsageOID.SERVER_AUTH
                    if server
                    else x509.ExtendedKeyUsageOID.CLIENT_AUTH
                ]
            ),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(cn)]), critical=False
        )
    return _pem(builder.sign(ca_key, hashes.SHA256()), key)


def _pem(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Issued:
    return Issued(
        cert=cert.public_bytes(serialization.Encoding.PEM),
        key=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


@dataclass(frozen=True)
class Pki:
    ca: Issued
    server: Issued
    client: Issued
    other_ca: Issued


@pytest.fixture(scope="module")
def pki() -> Pki:
    ca, ca_key, ca_cert = make_ca("kinetic test CA")
    other, _, _ = make_ca("another CA")
    return Pki(
        ca=ca,
        server=issue(ca_key, ca_cert, "kube.test", server=True),
        client=issue(ca_key, ca_cert, "kinetic-user", server=False),
        other_ca=other,
    )


@pytest.fixture
async def https_server(pki: Pki, tmp_path: Path) -> AsyncIterator[str]:
    """The server's URL; each answer says whose client certificate it got (or none)."""
    (tmp_path / "srv.crt").write_bytes(pki.server.cert)
    (tmp_path / "srv.key").write_bytes(pki.server.key)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "srv.crt", tmp_path / "srv.key")
    context.load_verify_locations(cadata=pki.ca.cert.decode())
    context.verify_mode = ssl.CERT_OPTIONAL

    async def handle(request: web.Request) -> web.Response:
        transport = request.transport
        peer = transport.get_extra_info("peercert") if transport is not None else None
        subject = dict(pair[0] for pair in peer["subject"]) if peer else {}
        return web.json_response(
            {
                "client": subject.get("commonName"),
                "authorization": request.headers.get("Authorization"),
            }
        )

    app = web.Application()
    app.router.add_get("/whoami", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"https://{host}:{port}"
    finally:
        await runner.cleanup()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def kubeconfig(where: Path, cluster: dict[str, Any], user: dict[str, Any]) -> Path:
    path = where / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def named_cluster(server: str, ca_cert: bytes) -> dict[str, str]:
    """A kubeconfig cluster trusting ``ca_cert``, reached under the certificate's name."""
    return {
        "server": server,
        "certificate-authority-data": b64(ca_cert),
        "tls-server-name": "kube.test",
    }


async def whoami(path: Path) -> Any:
    client = KubeClient(kubeconfig=str(path), attempts=1)
    try:
        return await client.get("/whoami", what="whoami", timeout=20)
    finally:
        await client.aclose()


async def test_ca_data_and_tls_server_name_verify_the_server(
    pki: Pki, https_server: str, tmp_path: Path
) -> None:
    cluster = named_cluster(https_server, pki.ca.cert)
    answer = await whoami(kubeconfig(tmp_path, cluster, {"token": "t"}))
    assert answer == {"client": None, "authorization": "Bearer t"}


async def test_a_ca_file_relative_to_the_kubeconfig(
    pki: Pki, https_server: str, tmp_path: Path
) -> None:
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "ca.pem").write_bytes(pki.ca.cert)
    cluster = {
        "server": https_server,
        "certificate-authority": "certs/ca.pem",
        "tls-server-name": "kube.test",
    }
    assert (await whoami(kubeconfig(tmp_path, cluster, {})))["authorization"] is None


async def test_without_tls_server_name_the_host_name_does_not_match(
    pki: Pki, https_server: str, tmp_path: Path
) -> None:
    cluster = {"server": https_server, "certificate-authority-data": b64(pki.ca.cert)}
    with pytest.raises(BackendError, match="whoami failed: .*IP address mismatch"):
        await whoami(kubeconfig(tmp_path, cluster, {}))


async def test_a_server_signed_by_another_ca_is_refused(
    pki: Pki, https_server: str, tmp_path: Path
) -> None:
    cluster = named_cluster(https_server, pki.other_ca.cert)
    with pytest.raises(BackendError, match="whoami failed: .*CERTIFICATE_VERIFY_FAILED"):
        await whoami(kubeconfig(tmp_path, cluster, {}))


async def test_the_system_cas_do_not_know_a_private_ca(https_server: str, tmp_path: Path) -> None:
    cluster = {"server": https_server, "tls-server-name": "kube.test"}
    with pytest.raises(BackendError, match="whoami failed: .*CERTIFICATE_VERIFY_FAILED"):
        await whoami(kubeconfig(tmp_path, cluster, {}))


async def test_insecure_skip_tls_verify_skips_verification(
    https_server: str, tmp_path: Path
) -> None:
    cluster = {"server": https_server, "insecure-skip-tls-verify": True}
    assert (await whoami(kubeconfig(tmp_path, cluster, {"token": "t"})))["client"] is None


async def test_client_certificates_as_data(pki: Pki, https_server: str, tmp_path: Path) -> None:
    cluster = {"server": https_server, "insecure-skip-tls-verify": True}
    user = {"client-certificate-data": b64(pki.client.cert), "client-key-data": b64(pki.client.key)}
    assert (await whoami(kubeconfig(tmp_path, cluster, user)))["client"] == "kinetic-user"


async def test_client_certificates_as_files(pki: Pki, https_server: str, tmp_path: Path) -> None:
    (tmp_path / "me.crt").write_bytes(pki.client.cert)
    (tmp_path / "me.key").write_bytes(pki.client.key)
    cluster = {
        "server": https_server,
        "certificate-authority-data": b64(pki.ca.cert),
        "tls-server-name": "kube.test",
    }
    user = {"client-certificate": "me.crt", "client-key": str(tmp_path / "me.key")}
    assert (await whoami(kubeconfig(tmp_path, cluster, user)))["client"] == "kinetic-user"


async def test_a_key_that_does_not_match_is_a_config_error(pki: Pki, tmp_path: Path) -> None:
    cluster = {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}
    user = {"client-certificate-data": b64(pki.client.cert), "client-key-data": b64(pki.ca.key)}
    with pytest.raises(ConfigError, match="not a usable PEM pair"):
        await whoami(kubeconfig(tmp_path, cluster, user))


async def test_a_missing_certificate_file_is_a_config_error(tmp_path: Path) -> None:
    cluster = {"server": "https://127.0.0.1:1", "certificate-authority": "nope.pem"}
    with pytest.raises(ConfigError, match="cannot read the certificate authority file"):
        await whoami(kubeconfig(tmp_path, cluster, {}))


async def test_ca_data_that_is_not_pem_is_a_config_error(tmp_path: Path) -> None:
    cluster = {"server": "https://127.0.0.1:1", "certificate-authority-data": b64(b"junk")}
    with pytest.raises(ConfigError, match="not a PEM certificate"):
        await whoami(kubeconfig(tmp_path, cluster, {}))


PLUGIN = """\
#!{python}
import json, os
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
with open(os.environ["INFO_FILE"], "w") as f:
    json.dump(info, f)
status = {{
    "clientCertificateData": open(os.environ["CERT"]).read(),
    "clientKeyData": open(os.environ["KEY"]).read(),
}}
print(json.dumps({{"apiVersion": "{version}", "kind": "ExecCredential", "status": status}}))
"""


async def test_an_exec_plugin_may_answer_with_a_client_certificate(
    pki: Pki, https_server: str, tmp_path: Path
) -> None:
    plugin = tmp_path / "cert-plugin"
    plugin.write_text(PLUGIN.format(python=sys.executable, version=V1))
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "me.crt").write_bytes(pki.client.cert)
    (tmp_path / "me.key").write_bytes(pki.client.key)
    env = {"CERT": "me.crt", "KEY": "me.key", "INFO_FILE": str(tmp_path / "info.json")}
    env = {k: str(tmp_path / v) if k != "INFO_FILE" else v for k, v in env.items()}
    cluster = {
        "server": https_server,
        "certificate-authority-data": b64(pki.ca.cert),
        "tls-server-name": "kube.test",
    }
    user = {
        "exec": {
            "apiVersion": V1,
            "command": str(plugin),
            "env": [{"name": k, "value": v} for k, v in env.items()],
            "provideClusterInfo": True,
        }
    }
    answer = await whoami(kubeconfig(tmp_path, cluster, user))
    assert answer == {"client": "kinetic-user", "authorization": None}
    info = json.loads((tmp_path / "info.json").read_text())
    sent = info["spec"]["cluster"]
    assert base64.b64decode(sent["certificate-authority-data"]) == pki.ca.cert
    assert sent["tls-server-name"] == "kube.test"
    assert sent["server"] == https_server
