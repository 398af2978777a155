"""The dashboard over plain HTTP: who gets in (token, Host, a POST's origin), and that a
batch's refresh reads its records a bounded number of times, whatever its size."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

import kinetic
from kinetic._dashboard import Dashboard, serve
from tests.fix_env import module_project
from tests.other_user import OTHER_UID, as_other_user, need_root

pytestmark = pytest.mark.local


@pytest.fixture
async def dash(kinetic_env: Path) -> AsyncIterator[Dashboard]:
    async with anyio.create_task_group() as tg:
        yield await tg.start(serve)
        tg.cancel_scope.cancel()


async def _ask(
    port: int, request: str, body: bytes = b"", *, host: str | None = None
) -> tuple[int, bytes]:
    head = request.replace("HOST", host or f"127.0.0.1:{port}")
    if body:
        head += f"\r\nContent-Length: {len(body)}"
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(head.encode() + b"\r\n\r\n" + body)
        data = b""
        while True:
            try:
                data += await stream.receive()
            except anyio.EndOfStream:
                break
    status = int(data.split(b" ", 2)[1])
    return status, data.partition(b"\r\n\r\n")[2]


async def test_a_wrong_or_missing_token_gets_403(dash: Dashboard) -> None:
    port, token = dash.port, dash.token
    assert dash.url == f"http://127.0.0.1:{port}/?t={token}"
    get = "GET {} HTTP/1.1\r\nHost: HOST"
    assert (await _ask(port, get.format(f"/?t={token}")))[0] == 200
    for path in ("/", "/?t=", f"/?t={token[:-1]}", f"/?t={token}x", "/batches", "/jobs/job-1"):
        status, body = await _ask(port, get.format(path))
        assert status == 403, path
        assert b"forbidden" in body
    # A page reached through another name (DNS rebinding) gets 403 too, token or not.
    assert (await _ask(port, get.format(f"/?t={token}"), host="evil.example:80"))[0] == 403
    # Malformed requests get 400, never an answer from a page.
    assert (await _ask(port, "GARBAGE"))[0] == 400


async def test_another_user_gets_nothing_even_with_the_token(
    dash: Dashboard, caplog: pytest.LogCaptureFixture
) -> None:
    need_root()
    port, token = dash.port, dash.token

    def probe() -> str:
        # A plain socket: create_connection would import the idna codec, which this
        # user cannot read under /root.
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(20)
            sock.connect(("127.0.0.1", port))
            request = f"GET /?t={token} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"
            try:
                sock.sendall(request.encode())
                answer = sock.recv(1024)
            except (ConnectionResetError, BrokenPipeError):
                return "closed"
        return answer.split(b"\r\n")[0].decode() if answer else "closed"

    with caplog.at_level("WARNING", logger="kinetic"):
        assert await anyio.to_thread.run_sync(as_other_user, probe) == "closed"
    assert any(f"uid {OTHER_UID}" in r.getMessage() for r in caplog.records), caplog.text
    assert (await _ask(port, f"GET /?t={token} HTTP/1.1\r\nHost: HOST"))[0] == 200


async def test_a_cancel_must_be_posted_from_the_page_with_the_token(dash: Dashboard) -> None:
    port, token = dash.port, dash.token
    post = "POST /batches/grp-0123456789ab/cancel HTTP/1.1\r\nHost: HOST\r\n{}"
    form = "Content-Type: application/x-www-form-urlencoded"
    # Without the token in the form, from another site, or not as a form: 403.
    assert (await _ask(port, post.format(form), b"t=nope"))[0] == 403
    evil = f"{form}\r\nOrigin: http://evil.example"
    assert (await _ask(port, post.format(evil), f"t={token}".encode()))[0] == 403
    cross = f"{form}\r\nSec-Fetch-Site: cross-site"
    assert (await _ask(port, post.format(cross), f"t={token}".encode()))[0] == 403
    plain = "Content-Type: text/plain"
    assert (await _ask(port, post.format(plain), f"t={token}".encode()))[0] == 403
    # From the page itself: it gets through to the batch (none here: 404).
    own = f"{form}\r\nOrigin: http://127.0.0.1:{port}\r\nSec-Fetch-Site: same-origin"
    assert (await _ask(port, post.format(own), f"t={token}".encode()))[0] == 404


async def test_refreshes_read_the_records_a_bounded_number_of_times(
    kinetic_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module_project(
        tmp_path / "proj",
        "dash_count",
        textwrap.dedent(
            """
            def f(x):
                if x % 3 == 0:
                    raise KeyError(x)
                return x
            """
        ),
        monkeypatch,
    )
    import dash_count  # type: ignore[import-not-found]

    import kinetic._dashboard.source as source_module
    from kinetic._dashboard.source import Source
    from kinetic._engine import runtime
    from kinetic._settings import load_settings

    monkeypatch.setattr(source_module, "FAILED_PER_REFRESH", 400)
    n = 3000  # 1,000 failures: grouped 400 per refresh
    batch = await kinetic.aio.run()(dash_count.f).run_async_map(range(n))
    await batch.wait()
    watch = await Source(runtime.backend_for_settings(load_settings())).batch(batch.group_id)
    await watch.refresh(force=True)
    # One snapshot, then the failures' headers FAILED_PER_REFRESH at a time.
    assert watch.reads == 2
    assert watch.progress.finished
    assert watch.progress.groups["KeyError"].count == 400
    await watch.refresh(force=True)
    await watch.refresh(force=True)
    assert watch.reads == 4
    assert watch.progress.groups["KeyError"].count == 1000
    await watch.refresh(force=True)
    assert watch.reads == 4  # finished and grouped: nothing more to read
    # Viewers share one look: a refresh within the interval reads nothing.
    watch.progress = type(watch.progress)(n)
    await watch.refresh()
    assert watch.reads == 4


def test_the_command_prints_its_url_stops_on_ctrl_c_and_says_why_it_cannot_listen(
    kinetic_env: Path,
) -> None:
    # A process started in the background inherits SIGINT ignored: take it as a shell's
    # foreground command does, then run `kinetic dashboard`.
    command = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "sys.argv = ['kinetic', 'dashboard']; runpy.run_module('kinetic', run_name='__main__')"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("Kinetic dashboard (file://")
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        assert "/?t=" in url
        port = int(url.split(":")[2].split("/")[0])
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "dashboard stopped" in err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        out = subprocess.run(
            [sys.executable, "-m", "kinetic", "dashboard", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert out.returncode == 1
    assert "the dashboard cannot listen" in out.stderr
