"""Credentials of the Kubernetes client, for real: an exec plugin that is a real
executable, token files on disk, and a loopback API server (aiohttp.web on 127.0.0.1)
that refuses a credential with 401 the way the API server does."""

from __future__ import annotations

import json
import stat
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from aiohttp import web

from kinetic import BackendError, ConfigError
from kinetic._backends.gke.client import KubeClient
from kinetic._backends.gke.credentials import Credentials
from kinetic._backends.gke.endpoint import load_endpoint, locate

V1 = "client.authentication.k8s.io/v1"

PLUGIN = """\
#!{python}
import json, os, sys, time
count = os.environ["PLUGIN_COUNT"]
with open(count, "a") as f:
    f.write("x")
with open(count) as f:
    n = len(f.read())
with open(count + ".info", "w") as f:
    f.write(os.environ.get("KUBERNETES_EXEC_INFO", ""))
time.sleep(float(os.environ.get("PLUGIN_SLEEP", "0")))
if os.environ.get("PLUGIN_MODE") == "fail":
    for i in range(8):
        print(f"problem line {{i}}", file=sys.stderr)
    sys.exit(3)
status = {{"token": f"tok-{{n}}"}}
expires = os.environ.get("PLUGIN_EXPIRES")
if expires == "past":
    status["expirationTimestamp"] = "2000-01-01T00:00:00Z"
elif expires == "future":
    status["expirationTimestamp"] = "2999-01-01T00:00:00Z"
print(json.dumps({{"apiVersion": "{version}", "kind": "ExecCredential", "status": status}}))
"""


@dataclass
class Plugin:
    path: Path
    count_file: Path

    @property
    def runs(self) -> int:
        return len(self.count_file.read_text()) if self.count_file.exists() else 0

    @property
    def exec_info(self) -> dict[str, Any]:
        info: dict[str, Any] = json.loads(Path(f"{self.count_file}.info").read_text())
        return info


@pytest.fixture
def plugin(tmp_path: Path) -> Plugin:
    path = tmp_path / "bin" / "kube-plugin"
    path.parent.mkdir()
    path.write_text(PLUGIN.format(python=sys.executable, version=V1))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return Plugin(path=path, count_file=tmp_path / "runs")


def write_kubeconfig(
    where: Path, server: str, user: dict[str, Any], cluster: dict[str, Any] | None = None
) -> Path:
    path = where / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "clusters": [{"name": "c", "cluster": {"server": server, **(cluster or {})}}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def exec_user(plugin: Plugin, command: str | None = None, **env: str) -> dict[str, Any]:
    variables = {"PLUGIN_COUNT": str(plugin.count_file), **env}
    return {
        "exec": {
            "apiVersion": V1,
            "command": command or str(plugin.path),
            "args": ["--flag"],
            "env": [{"name": k, "value": v} for k, v in variables.items()],
            "provideClusterInfo": True,
            "installHint": "install kube-plugin from the team wiki",
            "interactiveMode": "Never",
        }
    }


async def credentials(path: Path, *, exec_timeout: float = 30.0) -> Credentials:
    return Credentials(await load_endpoint(kubeconfig_path=str(path)), exec_timeout=exec_timeout)


# --------------------------------------------------------------------------- exec plugin


async def test_a_credential_is_cached_while_it_is_valid(plugin: Plugin, tmp_path: Path) -> None:
    config = write_kubeconfig(tmp_path, "https://h:1", exec_user(plugin, PLUGIN_EXPIRES="future"))
    creds = await credentials(config)
    first = await creds.auth()
    again = await creds.auth()
    assert first.headers == {"Authorization": "Bearer tok-1"}
    assert again is first
    assert plugin.runs == 1


async def test_a_credential_without_expiry_is_kept_until_refused(
    plugin: Plugin, tmp_path: Path
) -> None:
    creds = await credentials(write_kubeconfig(tmp_path, "https://h:1", exec_user(plugin)))
    first = await creds.auth()
    assert await creds.auth() is first
    assert creds.invalidate(first)
    assert (await creds.auth()).headers == {"Authorization": "Bearer tok-2"}
    assert plugin.runs == 2


async def test_an_expired_credential_is_renewed(plugin: Plugin, tmp_path: Path) -> None:
    config = write_kubeconfig(tmp_path, "https://h:1", exec_user(plugin, PLUGIN_EXPIRES="past"))
    creds = await credentials(config)
    assert (await creds.auth()).headers["Authorization"] == "Bearer tok-1"
    assert (await creds.auth()).headers["Authorization"] == "Bearer tok-2"
    assert plugin.runs == 2


async def test_concurrent_callers_share_one_run(plugin: Plugin, tmp_path: Path) -> None:
    config = write_kubeconfig(tmp_path, "https://h:1", exec_user(plugin, PLUGIN_SLEEP="0.5"))
    creds = await credentials(config)
    seen: list[str] = []

    async def ask() -> None:
        seen.append((await creds.auth()).headers["Authorization"])

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(ask)
    assert seen == ["Bearer tok-1"] * 10
    assert plugin.runs == 1


async def test_the_plugin_gets_its_env_and_the_cluster_info(plugin: Plugin, tmp_path: Path) -> None:
    config = write_kubeconfig(
        tmp_path,
        "https://h:1",
        exec_user(plugin),
        cluster={"insecure-skip-tls-verify": True, "tls-server-name": "api.test"},
    )
    await (await credentials(config)).auth()
    info = plugin.exec_info
    assert info["apiVersion"] == V1
    assert info["kind"] == "ExecCredential"
    assert info["spec"]["interactive"] is False
    assert info["spec"]["cluster"] == {
        "server": "https://h:1",
        "insecure-skip-tls-verify": True,
        "tls-server-name": "api.test",
    }


def test_another_loop_starts_from_the_credential_already_held(
    plugin: Plugin, tmp_path: Path
) -> None:
    config = write_kubeconfig(tmp_path, "https://h:1", exec_user(plugin, PLUGIN_EXPIRES="future"))

    async def first() -> Credentials:
        creds = await credentials(config)
        await creds.auth()
        return creds

    creds = anyio.run(first)
    other = creds.for_another_loop()
    auth = anyio.run(other.auth)
    assert auth.headers["Authorization"] == "Bearer tok-1"
    assert plugin.runs == 1


async def test_a_failing_plugin_is_a_config_error_with_its_story(
    plugin: Plugin, tmp_path: Path
) -> None:
    config = write_kubeconfig(tmp_path, "https://h:1", exec_user(plugin, PLUGIN_MODE="fail"))
    creds = await credentials(config)
    with pytest.raises(ConfigError) as info:
        await creds.auth()
    message = str(info.value)
    assert str(plugin.path) in message
    assert "exited with status 3" in message
    assert "problem line 7" in message
    assert "problem line 0" not in message  # the last lines only
    assert "install kube-plugin from the team wiki" in message


async def test_a_missing_plugin_is_a_config_error_with_the_install_hint(
    plugin: Plugin, tmp_path: Path
) -> None:
    user = exec_user(plugin, command="kinetic-no-such-plugin")
    creds = await credentials(write_kubeconfig(tmp_path, "https://h:1", user))
    with pytest.raises(ConfigError, match="'kinetic-no-such-plugin' was not found") as info:
        await creds.auth()
    assert "install kube-plugin from the team wiki" in str(info.value)


async def test_a_relative_command_runs_from_the_kubeconfig_directory(
    plugin: Plugin, tmp_path: Path
) -> None:
    creds = await credentials(
        write_kubeconfig(tmp_path, "https://h:1", exec_user(plugin, command="bin/kube-plugin"))
    )
    assert (await creds.auth()).headers["Authorization"] == "Bearer tok-1"


async def test_a_hanging_plugin_is_stopped_at_its_timeout(plugin: Plugin, tmp_path: Path) -> None:
    config = write_kubeconfig(tmp_path, "https://h:1", exec_user(plugin, PLUGIN_SLEEP="30"))
    creds = await credentials(config, exec_timeout=0.5)
    with anyio.fail_after(10), pytest.raises(ConfigError, match="did not finish within 0.5s"):
        await creds.auth()


# --------------------------------------------------------------------------- 401 and files


@dataclass
class FakeApiServer:
    """Answers 200 to the tokens in ``accepted``, 401 (a Status, as the API server
    words it) to anything else; ``on_refused`` runs on each refusal."""

    url: str = ""
    accepted: set[str] = field(default_factory=set)
    seen: list[str] = field(default_factory=list)
    on_refused: Any = None


@pytest.fixture
async def api_server() -> AsyncIterator[FakeApiServer]:
    server = FakeApiServer()

    async def handle(request: web.Request) -> web.Response:
        header = request.headers.get("Authorization", "")
        server.seen.append(header)
        if header.removeprefix("Bearer ") in server.accepted:
            return web.json_response({"kind": "Namespace", "metadata": {"name": "default"}})
        if server.on_refused is not None:
            server.on_refused()
        status = {
            "kind": "Status",
            "code": 401,
            "reason": "Unauthorized",
            "message": "Unauthorized",
        }
        return web.json_response(status, status=401)

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{name}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    server.url = f"http://{host}:{port}"
    try:
        yield server
    finally:
        await runner.cleanup()


async def read_namespace(config: Path) -> Any:
    client = KubeClient(kubeconfig=str(config), attempts=1)
    try:
        return await client.read_namespace("default", timeout=20)
    finally:
        await client.aclose()


async def test_a_refused_exec_credential_is_renewed_and_the_request_sent_again(
    plugin: Plugin, tmp_path: Path, api_server: FakeApiServer
) -> None:
    api_server.accepted = {"tok-2"}  # the first token has been revoked
    config = write_kubeconfig(tmp_path, api_server.url, exec_user(plugin, PLUGIN_EXPIRES="future"))
    namespace = await read_namespace(config)
    assert namespace["metadata"]["name"] == "default"
    assert api_server.seen == ["Bearer tok-1", "Bearer tok-2"]
    assert plugin.runs == 2


async def test_a_credential_refused_twice_is_a_backend_error(
    plugin: Plugin, tmp_path: Path, api_server: FakeApiServer
) -> None:
    config = write_kubeconfig(tmp_path, api_server.url, exec_user(plugin))
    with pytest.raises(BackendError, match="refused .* \\(HTTP 401\\): Unauthorized"):
        await read_namespace(config)
    assert api_server.seen == ["Bearer tok-1", "Bearer tok-2"]  # one renewal, not a loop


async def test_a_refused_static_token_is_not_sent_again(
    tmp_path: Path, api_server: FakeApiServer
) -> None:
    config = write_kubeconfig(tmp_path, api_server.url, {"token": "static"})
    with pytest.raises(BackendError, match="HTTP 401"):
        await read_namespace(config)
    assert api_server.seen == ["Bearer static"]


async def test_a_token_file_is_read_again_when_refused(
    tmp_path: Path, api_server: FakeApiServer
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("old\n")
    api_server.accepted = {"new"}
    api_server.on_refused = lambda: token_file.write_text("new\n")  # the kubelet rotated it
    config = write_kubeconfig(tmp_path, api_server.url, {"tokenFile": "token"})  # relative
    namespace = await read_namespace(config)
    assert namespace["metadata"]["name"] == "default"
    assert api_server.seen == ["Bearer old", "Bearer new"]


async def test_a_token_file_is_read_again_after_its_ttl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kinetic._backends.gke import credentials as module

    token_file = tmp_path / "token"
    token_file.write_text("one")
    creds = await credentials(write_kubeconfig(tmp_path, "https://h:1", {"tokenFile": "token"}))
    assert (await creds.auth()).headers["Authorization"] == "Bearer one"
    token_file.write_text("two")
    assert (await creds.auth()).headers["Authorization"] == "Bearer one"  # within the TTL
    monkeypatch.setattr(module, "TOKEN_FILE_TTL", 0.0)
    creds.invalidate(await creds.auth())  # drop the one held with the long TTL
    await creds.auth()  # read with a TTL of 0: stale at once
    token_file.write_text("three")
    assert (await creds.auth()).headers["Authorization"] == "Bearer three"


async def test_basic_auth_is_sent_as_the_api_server_expects(
    tmp_path: Path, api_server: FakeApiServer
) -> None:
    config = write_kubeconfig(tmp_path, api_server.url, {"username": "me", "password": "pw"})
    with pytest.raises(BackendError, match="HTTP 401"):
        await read_namespace(config)
    assert api_server.seen == ["Basic bWU6cHc="]


async def test_an_unreadable_token_file_is_a_config_error(tmp_path: Path) -> None:
    config = write_kubeconfig(tmp_path, "https://h:1", {"tokenFile": "missing"})
    with pytest.raises(ConfigError, match="cannot read the token file .*missing"):
        await read_namespace(config)


# --------------------------------------------------------------------------- locating


async def test_a_missing_kubeconfig_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no kubeconfig at .*nothing-here"):
        await read_namespace(tmp_path / "nothing-here")


async def test_configuration_errors_name_the_file(tmp_path: Path) -> None:
    config = write_kubeconfig(tmp_path, "https://h:1", {"auth-provider": {"name": "gcp"}})
    with pytest.raises(ConfigError, match=f"{config}: .*gke-gcloud-auth-plugin"):
        await read_namespace(config)


def test_locate_follows_kubectl(tmp_path: Path) -> None:
    assert locate("/x/explicit", {"KUBECONFIG": "/y"}, tmp_path) == ["/x/explicit"]
    assert locate(None, {"KUBECONFIG": "/a::/b"}, tmp_path) == ["/a", "/b"]  # all, merged
    assert locate(None, {}, tmp_path) == [str(tmp_path / ".kube" / "config")]
    in_pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    assert locate(None, in_pod, tmp_path) is None  # no file: the service account
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text("{}")
    assert locate(None, in_pod, tmp_path) == [str(tmp_path / ".kube" / "config")]
