"""kubernetes-asyncio's session looks up proxies and netrc per request only where the
environment has them (kinetic._net.skip_empty_env_lookups)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes_asyncio import client as k8s_client

from kinetic._net import skip_empty_env_lookups

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


async def _trusts_env() -> bool:
    cfg = type.__call__(k8s_client.Configuration)
    cfg.host = "https://127.0.0.1:6443"
    api = skip_empty_env_lookups(k8s_client.ApiClient(configuration=cfg))
    try:
        return bool(api.rest_client.pool_manager.trust_env)
    finally:
        await api.close()


async def test_an_environment_without_proxy_or_netrc_is_not_looked_up(clean_env: Path) -> None:
    assert not await _trusts_env()


async def test_a_proxy_variable_keeps_the_lookups(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    assert await _trusts_env()


async def test_a_netrc_file_keeps_the_lookups(clean_env: Path) -> None:
    (clean_env / ".netrc").write_text("machine 127.0.0.1 login me password secret\n")
    (clean_env / ".netrc").chmod(0o600)
    assert await _trusts_env()
