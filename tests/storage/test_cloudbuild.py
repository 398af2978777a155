"""CloudBuildBuilder against a fake Cloud Build REST API and a real fake-gcs-server.

The source upload and the build log go through a real ``GCSStorage`` on
fake-gcs-server (``tests.fix_gcs``). Cloud Build itself has no emulator, so its REST
API is a small stateful fake served on loopback (``tests.loopback_http``), written from Google's
documented v1 shapes: ``POST .../builds`` answers a long-running Operation, each
``GET .../builds/{id}`` advances the build QUEUED → WORKING → outcome while writing a
growing log object into the bucket (as Cloud Build does, under ``logsBucket``), and
``POST .../builds/{id}:cancel`` cancels it. Pure helpers are tested at the end.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import tarfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from aiohttp import web

from kinetic._exceptions import ImageBuildError
from kinetic._images import runner_image
from kinetic._images.cloudbuild import (
    LOG_TAIL_LINES,
    RUNNING_STATUSES,
    TERMINAL_STATUSES,
    CloudBuildBuilder,
    LogLines,
    build_from_operation,
    build_request,
    failing_step,
    failure_message,
    is_terminal,
    source_key,
)
from kinetic._storage.gcs import GCSStorage
from tests.loopback_http import BREAK, Request, reply, serve

pytestmark = pytest.mark.storage

PROJECT = "kt-project"
TOKEN = "ya29.test-token"
IMAGE = "us-docker.pkg.dev/kt-project/kinetic/runner:0123abcd"
FAILED_LINE = 'ERROR: process "/bin/sh -c pip install nope" did not complete: exit code: 1'

Fault = web.Response
"""What the fake answers instead of a request: an HTTP answer, or ``BREAK`` (a transport
fault: the answer breaks off)."""

_ROUTE = re.compile(
    r"/v1/projects/(?P<project>[^/]+)/builds(?:/(?P<id>[^/:]+)(?P<cancel>:cancel)?)?"
)


def api_error(status: int, message: str, code: str) -> web.Response:
    """An error answer in Google's JSON error shape."""
    return reply(status, json={"error": {"code": status, "message": message, "status": code}})


@dataclass
class FakeCloudBuild:
    """A stateful stand-in for the Cloud Build v1 REST API.

    :ivar outcome: the terminal status builds reach, or None for builds that never end.
    :ivar working_polls: GETs answered WORKING before the outcome.
    :ivar faults: per route (``create``, ``get``, ``cancel``), answers to give instead
        of the next requests, in order.
    """

    storage: GCSStorage
    log_lines: list[str]
    outcome: str | None = "SUCCESS"
    working_polls: int = 4
    faults: dict[str, list[Fault]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    builds: dict[str, dict[str, Any]] = field(default_factory=dict)
    log_keys: dict[str, str] = field(default_factory=dict)
    polls: int = 0
    cancelled: list[str] = field(default_factory=list)

    def sent(self, route: str) -> list[Request]:
        """The requests received for one route (faulted ones included)."""
        return [r for r in self.requests if _route_of(r) == route]

    async def handle(self, request: Request) -> web.Response:
        self.requests.append(request)
        route = _route_of(request)
        if route is None:
            return api_error(404, f"no route {request.method} {request.url.path}", "NOT_FOUND")
        if self.faults.get(route):
            return self.faults[route].pop(0)
        match = _ROUTE.fullmatch(request.url.path)
        assert match is not None
        if route == "create":
            return self._create(json.loads(request.content))
        build = self.builds.get(match["id"])
        if build is None:
            return api_error(404, f"build {match['id']} not found", "NOT_FOUND")
        if route == "cancel":
            self.cancelled.append(build["id"])
            build["status"] = "CANCELLED"
            return reply(200, json=build)
        await self._advance(build)
        return reply(200, json=build)

    def _create(self, body: dict[str, Any]) -> web.Response:
        build_id = str(uuid.uuid4())
        logs_bucket = body["logsBucket"]
        bucket, _, prefix = logs_bucket.removeprefix("gs://").partition("/")
        assert bucket == self.storage.bucket, logs_bucket
        self.log_keys[build_id] = f"{prefix}/log-{build_id}.txt"
        build = {
            "id": build_id,
            "projectId": PROJECT,
            "status": "QUEUED",
            "source": body["source"],
            "steps": [dict(step) for step in body["steps"]],
            "images": body["images"],
            "logsBucket": logs_bucket,
            "logUrl": f"https://console.cloud.google.com/cloud-build/builds/{build_id}",
            "timeout": body["timeout"],
        }
        self.builds[build_id] = build
        operation = {
            "name": f"operations/build/{PROJECT}/{uuid.uuid4().hex}",
            "metadata": {
                "@type": "type.googleapis.com/google.devtools.cloudbuild.v1.BuildOperationMetadata",
                "build": build,
            },
        }
        return reply(200, json=operation)

    async def _advance(self, build: dict[str, Any]) -> None:
        """One GET's worth of progress: more log, then the outcome."""
        if build["status"] in TERMINAL_STATUSES:
            return
        self.polls += 1
        lines = self.log_lines
        if self.outcome is None or self.polls <= self.working_polls:
            build["status"] = "WORKING"
            shown = len(lines) * min(self.polls, self.working_polls) // (self.working_polls + 1)
            # A half-written next line, as a log flushed mid-line looks.
            fragment = lines[shown][:5] if shown < len(lines) else ""
            text = "".join(line + "\n" for line in lines[:shown]) + fragment
        else:
            build["status"] = self.outcome
            text = "\n".join(lines)  # the last line is unterminated: the flush must show it
            for step in build["steps"]:
                step["status"] = "SUCCESS" if self.outcome == "SUCCESS" else "FAILURE"
            if self.outcome == "FAILURE":
                build["statusDetail"] = 'Build step failure: build step 0 "docker" failed'
                build["failureInfo"] = {
                    "type": "USER_BUILD_STEP",
                    "detail": "Build step failure: step exited with non-zero status: 1",
                }
        await self.storage.write(self.log_keys[build["id"]], text.encode())


def _route_of(request: Request) -> str | None:
    match = _ROUTE.fullmatch(request.url.path)
    if match is None or match["project"] != PROJECT:
        return None
    if request.method == "POST" and match["id"] is None:
        return "create"
    if request.method == "POST" and match["cancel"]:
        return "cancel"
    if request.method == "GET" and match["id"] and not match["cancel"]:
        return "get"
    return None


async def injected_token() -> str:
    return TOKEN


def make_context() -> bytes:
    """An uncompressed tar with a Dockerfile at its root, as build_context makes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in {
            "Dockerfile": b"FROM python:3.11-slim\nCOPY . /app\n",
            "app/main.py": b"print('hello')\n" * 200,
        }.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


MakeBuilder = Callable[..., CloudBuildBuilder]
"""``make_builder(fake, storage, bucket, **options)``: a builder whose Cloud Build is
``fake``."""


@pytest.fixture
async def make_builder(gcs_storage: GCSStorage) -> AsyncIterator[MakeBuilder]:
    """Makes builders on the fake of the test's choice, served on loopback in the
    test's loop (the fake writes build logs through the test's own storage).

    It depends on ``gcs_storage`` so that the server stops, letting a request still
    in its handler finish, before that storage closes: a caller cancelled mid-poll
    leaves the fake's log write running past the test's end.
    """
    fakes: list[FakeCloudBuild] = []

    async def handle(request: Request) -> web.Response:
        return await fakes[-1].handle(request)

    async with serve(handle) as server:

        def make(
            fake: FakeCloudBuild, storage: GCSStorage, bucket: str, **options: Any
        ) -> CloudBuildBuilder:
            fakes.append(fake)
            options = {"poll_interval": 0.01, "backoff": 0.001, "max_backoff": 0.01, **options}
            options.setdefault("token", injected_token)
            return CloudBuildBuilder(PROJECT, storage, bucket, base_url=server.url, **options)

        yield make


def log_of(n: int) -> list[str]:
    return [f"Step {i}/{n}: RUN echo line-{i}" for i in range(n)]


def collector() -> tuple[list[str], Callable[[str], None]]:
    lines: list[str] = []
    return lines, lines.append


# -- behaviour users rely on -------------------------------------------------------------


async def test_successful_build_uploads_source_submits_and_streams_log(
    make_builder: MakeBuilder, gcs_storage: GCSStorage, gcs_bucket: str
) -> None:
    fake = FakeCloudBuild(gcs_storage, log_of(25))
    builder = make_builder(fake, gcs_storage, gcs_bucket)
    context = make_context()
    seen, progress = collector()

    await builder.build_and_push(context, IMAGE, progress=progress, timeout=60)

    assert builder.name == "cloudbuild"
    # The source is really in the bucket, gzipped, under its content address.
    key = f"cloudbuild/sources/{hashlib.sha256(context).hexdigest()}.tar.gz"
    assert gzip.decompress(await gcs_storage.read(key)) == context
    # The build names the image, the bucket and that object; its log goes to the bucket.
    (create,) = fake.sent("create")
    body = json.loads(create.content)
    assert body["source"] == {"storageSource": {"bucket": gcs_bucket, "object": key}}
    assert body["images"] == [IMAGE]
    assert body["steps"][0]["name"] == "gcr.io/cloud-builders/docker"
    assert body["steps"][0]["args"][-3:] == ["-t", IMAGE, "."]
    assert body["logsBucket"] == f"gs://{gcs_bucket}/cloudbuild/logs"
    assert body["timeout"] == "60s"
    # Every request, polls included, carries the injected token.
    assert len(fake.sent("get")) == fake.working_polls + 1
    assert {r.headers["authorization"] for r in fake.requests} == {f"Bearer {TOKEN}"}
    # Every log line, in order, exactly once: no half lines, the unterminated last included.
    assert seen == fake.log_lines
    assert fake.cancelled == []


async def test_a_bundled_build_submits_the_index_paths_context(
    gcs_storage: GCSStorage, gcs_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cloud Build's default install path: the context uploaded for a project image is
    its hashed requirements, installed from the index inside the build; no wheel is
    downloaded here. The registry the image is pushed to is the same loopback server."""
    monkeypatch.setenv("KINETIC_WHEEL_CACHE", str(tmp_path / "wheels"))
    fake = FakeCloudBuild(gcs_storage, log_of(3), working_polls=1)

    async def handle(request: Request) -> web.Response:
        if request.path.startswith("/v2/"):  # the registry lists the image once built
            return reply(200 if fake.builds else 404, json={})
        return await fake.handle(request)

    async with serve(handle) as server:
        builder = CloudBuildBuilder(
            PROJECT,
            gcs_storage,
            gcs_bucket,
            base_url=server.url,
            token=injected_token,
            poll_interval=0.01,
        )
        assert builder.install == "index"
        registry = f"{server.url.removeprefix('http://')}/kt"
        env = runner_image.env_plan(registry, "python:3.11-slim", ("six==1.16.0",))
        runtime = await anyio.to_thread.run_sync(runner_image.runner_plan, env)
        project = runner_image.project_plan(runtime, ("tabulate==0.9.0",))
        await runner_image.build(project, builder)

    (create,) = fake.sent("create")
    body = json.loads(create.content)
    assert body["images"] == [project.uri]
    uploaded = await gcs_storage.read(body["source"]["storageSource"]["object"])
    assert len(uploaded) < 4_000  # what left this machine: kilobytes
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(uploaded))) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    assert set(files) == {"Dockerfile", "user-requirements.txt", "runtime-constraints.txt"}
    assert b"pip install --require-hashes" in files["Dockerfile"]
    assert b"--no-index" not in files["Dockerfile"]
    assert files["user-requirements.txt"].startswith(b"tabulate==0.9.0 \\\n    --hash=sha256:")
    assert files["runtime-constraints.txt"] == b"six==1.16.0\n"
    assert not (tmp_path / "wheels").exists()


async def test_failed_build_names_step_status_and_log_tail(
    make_builder: MakeBuilder, gcs_storage: GCSStorage, gcs_bucket: str
) -> None:
    fake = FakeCloudBuild(gcs_storage, [*log_of(60), FAILED_LINE], outcome="FAILURE")
    builder = make_builder(fake, gcs_storage, gcs_bucket)

    with pytest.raises(ImageBuildError) as info:
        await builder.build_and_push(make_context(), IMAGE, timeout=60)

    message = str(info.value)
    (build_id,) = fake.builds
    for part in (IMAGE, build_id, "FAILURE", "step 0", "gcr.io/cloud-builders/docker"):
        assert part in message
    assert "USER_BUILD_STEP" in message
    assert "step exited with non-zero status: 1" in message
    assert message.endswith(FAILED_LINE)
    tail = fake.log_lines[-LOG_TAIL_LINES:]
    assert "\n".join(tail) in message
    assert fake.log_lines[0] not in message.split("\n")  # only the tail
    assert fake.cancelled == []  # a finished build is not cancelled


async def test_throttling_and_server_errors_are_retried(
    make_builder: MakeBuilder, gcs_storage: GCSStorage, gcs_bucket: str
) -> None:
    fake = FakeCloudBuild(
        gcs_storage,
        log_of(5),
        faults={
            "create": [api_error(429, "slow down", "RESOURCE_EXHAUSTED"), reply(503)],
            "get": [api_error(429, "slow down", "RESOURCE_EXHAUSTED"), reply(503)],
        },
    )
    seen, progress = collector()

    await make_builder(fake, gcs_storage, gcs_bucket).build_and_push(
        make_context(), IMAGE, progress=progress, timeout=60
    )

    assert len(fake.sent("create")) == 3
    assert len(fake.builds) == 1
    assert len(fake.sent("get")) == fake.working_polls + 1 + 2
    assert seen == fake.log_lines


async def test_forbidden_is_not_retried_and_its_message_surfaces(
    make_builder: MakeBuilder, gcs_storage: GCSStorage, gcs_bucket: str
) -> None:
    message = "Cloud Build API has not been used in project kt-project before or it is disabled."
    fake = FakeCloudBuild(
        gcs_storage, log_of(5), faults={"create": [api_error(403, message, "PERMISSION_DENIED")]}
    )

    with pytest.raises(ImageBuildError) as info:
        await make_builder(fake, gcs_storage, gcs_bucket).build_and_push(
            make_context(), IMAGE, timeout=60
        )

    assert "403" in str(info.value)
    assert message in str(info.value)
    assert "PERMISSION_DENIED" in str(info.value)
    assert len(fake.sent("create")) == 1
    assert fake.builds == {}


async def test_connection_errors_are_retried(
    make_builder: MakeBuilder, gcs_storage: GCSStorage, gcs_bucket: str
) -> None:
    fake = FakeCloudBuild(
        gcs_storage,
        log_of(5),
        faults={
            "create": [BREAK, BREAK],  # answers that break off: the connection is lost
            "get": [BREAK, BREAK],
        },
    )

    await make_builder(fake, gcs_storage, gcs_bucket).build_and_push(
        make_context(), IMAGE, timeout=60
    )

    assert len(fake.sent("create")) == 3
    assert len(fake.builds) == 1
    assert len(fake.sent("get")) == fake.working_polls + 1 + 2


@pytest.mark.parametrize("fault", [BREAK, reply(503)])
async def test_persistent_faults_give_up_after_attempts(
    make_builder: MakeBuilder, gcs_storage: GCSStorage, gcs_bucket: str, fault: Fault
) -> None:
    fake = FakeCloudBuild(gcs_storage, log_of(5), faults={"create": [fault] * 10})

    with pytest.raises(ImageBuildError) as info:
        await make_builder(fake, gcs_storage, gcs_bucket, attempts=3).build_and_push(
            make_context(), IMAGE, timeout=60
        )

    assert len(fake.sent("create")) == 3
    if isinstance(fault, web.Response):
        assert "HTTP 503" in str(info.value)
    else:
        assert isinstance(info.value.__cause__, aiohttp.ClientPayloadError)
        assert "ClientPayloadError" in str(info.value)


async def test_timeout_cancels_the_remote_build(
    make_builder: MakeBuilder, gcs_storage: GCSStorage, gcs_bucket: str
) -> None:
    fake = FakeCloudBuild(gcs_storage, log_of(30), outcome=None)
    seen, progress = collector()
    started = time.monotonic()

    with pytest.raises(ImageBuildError, match="timed out after 0.3s") as info:
        await make_builder(fake, gcs_storage, gcs_bucket).build_and_push(
            make_context(), IMAGE, progress=progress, timeout=0.3
        )

    assert time.monotonic() - started < 5
    (build_id,) = fake.builds
    assert fake.cancelled == [build_id]
    assert build_id in str(info.value)
    (cancel,) = fake.sent("cancel")
    assert cancel.headers["authorization"] == f"Bearer {TOKEN}"
    assert seen == fake.log_lines[: len(seen)]  # what streamed was the log's start


async def test_cancelling_the_caller_cancels_the_remote_build(
    make_builder: MakeBuilder, gcs_storage: GCSStorage, gcs_bucket: str
) -> None:
    fake = FakeCloudBuild(gcs_storage, log_of(5), outcome=None)

    with anyio.move_on_after(0.3) as scope:
        await make_builder(fake, gcs_storage, gcs_bucket).build_and_push(
            make_context(), IMAGE, timeout=60
        )

    assert scope.cancelled_caught  # the cancellation propagated, not an ImageBuildError
    assert fake.cancelled == list(fake.builds)
    assert len(fake.cancelled) == 1


async def test_upload_failure_is_an_image_build_error(
    make_builder: MakeBuilder, gcs_storage: GCSStorage
) -> None:
    fake = FakeCloudBuild(gcs_storage, log_of(5))
    async with GCSStorage(f"kt-missing-{uuid.uuid4().hex[:16]}", attempts=1) as missing:
        builder = make_builder(fake, missing, missing.bucket)
        with pytest.raises(ImageBuildError, match="uploading the build context"):
            await builder.build_and_push(make_context(), IMAGE, timeout=30)
    assert fake.requests == []  # nothing was submitted


async def test_token_failure_is_an_image_build_error(
    make_builder: MakeBuilder, gcs_storage: GCSStorage, gcs_bucket: str
) -> None:
    async def broken_token() -> str:
        raise RuntimeError("no credentials found")

    fake = FakeCloudBuild(gcs_storage, log_of(5))
    builder = make_builder(fake, gcs_storage, gcs_bucket, token=broken_token)
    with pytest.raises(ImageBuildError, match="no credentials found"):
        await builder.build_and_push(make_context(), IMAGE, timeout=30)
    assert fake.requests == []


@pytest.fixture
async def token_endpoint() -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    """A loopback OAuth token endpoint; yields its URL and the forms posted to it."""
    posted: list[dict[str, str]] = []

    async def handle(request: web.Request) -> web.Response:
        posted.append(dict(await request.post()))  # type: ignore[arg-type]
        return web.json_response(
            {"access_token": "adc-token", "expires_in": 3600, "token_type": "Bearer"}
        )

    app = web.Application()
    app.router.add_post("/token", handle)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}/token", posted
    finally:
        await runner.cleanup()


async def test_default_token_uses_application_default_credentials(
    make_builder: MakeBuilder,
    gcs_storage: GCSStorage,
    gcs_bucket: str,
    token_endpoint: tuple[str, list[dict[str, str]]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, posted = token_endpoint
    credentials = {
        "type": "authorized_user",
        "client_id": "client",
        "client_secret": "secret",
        "refresh_token": "refresh-me",
        "token_uri": url,
    }
    (tmp_path / "adc.json").write_text(json.dumps(credentials))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "adc.json"))
    fake = FakeCloudBuild(gcs_storage, log_of(3))

    await make_builder(fake, gcs_storage, gcs_bucket, token=None).build_and_push(
        make_context(), IMAGE, timeout=60
    )

    assert {r.headers["authorization"] for r in fake.requests} == {"Bearer adc-token"}
    assert [form["refresh_token"] for form in posted] == ["refresh-me"]  # fetched once


async def test_missing_credentials_are_an_image_build_error(
    make_builder: MakeBuilder,
    gcs_storage: GCSStorage,
    gcs_bucket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    fake = FakeCloudBuild(gcs_storage, log_of(3))
    builder = make_builder(fake, gcs_storage, gcs_bucket, token=None)
    context = make_context()
    with pytest.raises(ImageBuildError, match="no usable Google credentials"):
        await builder.build_and_push(context, IMAGE, timeout=30)
    assert fake.requests == []
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")  # the emulator's client reads it too
    assert not await gcs_storage.exists(source_key(context))  # failed before uploading


# -- pure parts ----------------------------------------------------------------------


def test_build_request_shape() -> None:
    body = build_request(
        IMAGE, bucket="b", source_object="cloudbuild/sources/x.tar.gz", timeout=1800
    )
    assert body == {
        "source": {"storageSource": {"bucket": "b", "object": "cloudbuild/sources/x.tar.gz"}},
        "steps": [
            {
                "name": "gcr.io/cloud-builders/docker",
                "args": ["build", "--network", "cloudbuild", "-t", IMAGE, "."],
            }
        ],
        "images": [IMAGE],
        "logsBucket": "gs://b/cloudbuild/logs",
        "timeout": "1800s",
    }
    assert build_request(IMAGE, bucket="b", source_object="o", timeout=0.3)["timeout"] == "1s"
    assert source_key(b"abc") == f"cloudbuild/sources/{hashlib.sha256(b'abc').hexdigest()}.tar.gz"


def test_status_table() -> None:
    assert not TERMINAL_STATUSES & RUNNING_STATUSES
    for status in ("SUCCESS", "FAILURE", "INTERNAL_ERROR", "TIMEOUT", "CANCELLED", "EXPIRED"):
        assert is_terminal(status)
    for status in ("STATUS_UNKNOWN", "PENDING", "QUEUED", "WORKING", "SOMETHING_NEW"):
        assert not is_terminal(status)


def test_log_lines_hold_back_partial_lines_until_final() -> None:
    lines = LogLines()
    assert lines.feed(b"") == []
    assert lines.feed(b"one\ntw") == ["one"]
    assert lines.feed(b"one\ntwo\r\nthr") == ["two"]
    assert lines.feed(b"one\ntwo\r\nthr") == []
    assert lines.feed(b"one\ntwo\r\nthree \xff", final=True) == ["three \ufffd"]
    assert list(lines.tail) == ["one", "two", "three \ufffd"]
    many = LogLines()
    many.feed(b"".join(b"%d\n" % i for i in range(100)))
    assert list(many.tail) == [str(i) for i in range(100 - LOG_TAIL_LINES, 100)]


def test_failure_message_names_the_first_failing_step() -> None:
    build = {
        "id": "b-1",
        "status": "FAILURE",
        "statusDetail": "Build step failure",
        "steps": [
            {"name": "ubuntu", "args": ["true"], "status": "SUCCESS"},
            {"name": "gcr.io/cloud-builders/docker", "args": ["build", "."], "status": "FAILURE"},
            {"name": "ubuntu", "args": ["false"], "status": "FAILURE"},
        ],
    }
    message = failure_message(IMAGE, build, ["a", "b"])
    assert failing_step(build) == "step 1: gcr.io/cloud-builders/docker build ."
    assert "step 1: gcr.io/cloud-builders/docker build ." in message
    assert "step 2" not in message
    assert message.startswith(f"Cloud Build b-1 of {IMAGE} ended with status FAILURE")
    assert message.endswith("a\nb")
    assert failing_step({"status": "TIMEOUT"}) is None
    assert failure_message(IMAGE, {"id": "b", "status": "TIMEOUT"}, []).endswith("written)")


@pytest.mark.parametrize(
    "operation",
    [{}, {"metadata": {}}, {"metadata": {"build": {"id": "../x"}}}, {"metadata": {"build": {}}}],
)
def test_operation_without_a_usable_build_is_refused(operation: dict[str, Any]) -> None:
    with pytest.raises(ImageBuildError):
        build_from_operation(operation)
