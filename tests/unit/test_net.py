"""Kinetic's sessions look up proxies and netrc per request only where the environment
has them (kinetic._net.trust_env_needed), and the Kubernetes client's session follows
that decision."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kinetic._backends.gke.client import KubeClient
from kinetic._net import trust_env_needed

_PROXY_VARIABLES = [
    f"{scheme}_proxy" for scheme in ("http", "https", "ws", "wss", "all", "no", "ftp")
]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No proxy variables, no NETRC, a home without a .netrc; returns that home."""
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.delenv("NETRC", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_an_environment_without_proxy_or_netrc_is_not_looked_up(clean_env: Path) -> None:
    assert not trust_env_needed()


@pytest.mark.parametrize("name", ["HTTPS_PROXY", "http_proxy", "WSS_PROXY"])
def test_a_proxy_variable_keeps_the_lookups(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(name, "http://proxy.invalid:3128")
    assert trust_env_needed()


def test_a_proxy_for_other_schemes_only_does_not(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FTP_PROXY", "http://proxy.invalid:3128")
    assert not trust_env_needed()


def test_a_netrc_file_keeps_the_lookups(clean_env: Path) -> None:
    (clean_env / ".netrc").write_text("machine 127.0.0.1 login me password secret\n")
    (clean_env / ".netrc").chmod(0o600)
    assert trust_env_needed()


async def _client_trusts_env(home: Path) -> bool:
    kubeconfig = home / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    client = KubeClient(kubeconfig=str(kubeconfig))
    try:
        _, _, http = await client._connection()
        session = await http.session()
        return session.trust_env
    finally:
        await client.aclose()


async def test_the_kubernetes_client_follows_the_decision(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not await _client_trusts_env(clean_env)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    assert await _client_trusts_env(clean_env)
