"""Google Cloud Build over its REST API (v1), through Kinetic's HTTP edge (:mod:`kinetic._http`).

Theory of operation
-------------------
:meth:`CloudBuildBuilder.build_and_push` runs five steps, all under one
:func:`anyio.fail_after` with the call's ``timeout``:

1. **Upload.** The build context (an uncompressed tar) is gzipped in a worker thread
   and written through the jobs bucket's :class:`~kinetic._storage.base.Storage` to
   ``cloudbuild/sources/{sha256 of the tar}.tar.gz``.
2. **Submit.** ``POST /v1/projects/{project}/builds`` with one ``docker build`` step
   and ``images: [image]``; Cloud Build pushes ``images`` only after every step
   succeeded, which is the push. The reply is a long-running Operation whose
   ``metadata.build.id`` names the build.
3. **Follow.** Cloud Build has no watch API, so the build is polled with
   ``GET /v1/projects/{project}/builds/{id}`` every ``poll_interval`` seconds until
   its ``status`` is terminal (:data:`TERMINAL_STATUSES`).
4. **Stream the log.** Cloud Build writes the log to
   ``{logsBucket}/log-{id}.txt``, which is read through the storage on each poll;
   every new complete line goes to ``progress``. After the terminal status it is read
   once more, and the last (possibly unterminated) line is flushed too.
5. **Verdict.** Any status but ``SUCCESS`` raises :class:`~kinetic.ImageBuildError`
   naming the image, the build, its status and details, the failing step, and ending
   with the log tail (:func:`failure_message`).

Every request carries ``Authorization: Bearer {token}``; the default token source (a
``gcloud.aio.auth.Token``) is set up before the upload, so missing credentials fail
before any bytes are sent. HTTP 429 and 5xx and transport faults (connect errors,
resets, one attempt's timeout) are retried with exponential back-off and jitter, for at
most ``attempts`` tries (the edge's rules); any other HTTP error fails at once with its
status and Google's error message. Creating a build is not idempotent:
when a retried ``POST`` had in fact reached Cloud Build, a duplicate build of the same
image runs to completion on its own (it pushes the same tag).

Ownership of the remote build: once submitted, the build lives exactly as long as the
call. If the call ends before a terminal status was seen (its timeout ran out, it was
cancelled, following the build failed, the ``progress`` callback raised), the build is
cancelled on the server, best effort, under a shield bounded by
:data:`CANCEL_TIMEOUT`. A timeout or cancellation during the submit itself leaves no
build id to cancel.

The pure parts (the request body, the status table, the log splitter, the failure
message) are module-level and do no IO.
"""

from __future__ import annotations

import collections
import contextlib
import gzip
import hashlib
import logging
import math
import re
import shlex
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import anyio
import anyio.to_thread

from kinetic._exceptions import (
    BackendError,
    ConfigError,
    ImageBuildError,
    ObjectNotFoundError,
    StorageError,
)
from kinetic._http import HttpClient, Reply, TokenSource, Transient
from kinetic._images.builder import BUILD_TIMEOUT, Progress
from kinetic._images.gauth import google_token_source
from kinetic._storage.base import Storage

__all__ = [
    "CANCEL_TIMEOUT",
    "DEFAULT_BASE_URL",
    "DOCKER_STEP_IMAGE",
    "LOGS_PREFIX",
    "LOG_TAIL_LINES",
    "REQUEST_TIMEOUT",
    "RUNNING_STATUSES",
    "SOURCES_PREFIX",
    "TERMINAL_STATUSES",
    "CloudBuildBuilder",
    "LogLines",
    "build_from_operation",
    "build_request",
    "failing_step",
    "failure_message",
    "is_terminal",
    "log_key",
    "source_key",
]

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://cloudbuild.googleapis.com"
DOCKER_STEP_IMAGE = "gcr.io/cloud-builders/docker"

SOURCES_PREFIX = "cloudbuild/sources"
"""Where build contexts are uploaded, relative to the bucket."""

LOGS_PREFIX = "cloudbuild/logs"
"""Where Cloud Build writes build logs, relative to the bucket."""

LOG_TAIL_LINES = 40
"""Lines of the build log that end a failure message."""

REQUEST_TIMEOUT = 60.0
"""Seconds one HTTP attempt may wait for a connection, or for the next bytes of an answer."""

LOG_READ_TIMEOUT = 30.0
"""Seconds one read of the build log may take."""

CANCEL_TIMEOUT = 10.0
"""Seconds the best-effort cancellation of a remote build may take, retries included."""

TERMINAL_STATUSES = frozenset(
    {"SUCCESS", "FAILURE", "INTERNAL_ERROR", "TIMEOUT", "CANCELLED", "EXPIRED"}
)
"""Build statuses after which nothing changes."""

RUNNING_STATUSES = frozenset({"STATUS_UNKNOWN", "PENDING", "QUEUED", "WORKING"})
"""Build statuses that will change. A status in neither table (a future addition) is
treated as running: the call's timeout still bounds the wait."""

_BUILD_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


# -- pure parts ----------------------------------------------------------------------


def source_key(context: bytes) -> str:
    """The storage key the gzipped ``context`` is uploaded to (content-addressed)."""
    return f"{SOURCES_PREFIX}/{hashlib.sha256(context).hexdigest()}.tar.gz"


def log_key(build_id: str) -> str:
    """The storage key, relative to the bucket, of the build's log."""
    return f"{LOGS_PREFIX}/log-{build_id}.txt"


def build_request(image: str, *, bucket: str, source_object: str, timeout: float) -> dict[str, Any]:
    """The ``Build`` resource to submit: build the uploaded source, push ``image``.

    The step runs on Cloud Build's ``cloudbuild`` network (the one builds normally
    use); ``timeout`` is rounded up to whole seconds, at least one (``0s`` would mean
    Cloud Build's default).
    """
    return {
        "source": {"storageSource": {"bucket": bucket, "object": source_object}},
        "steps": [
            {
                "name": DOCKER_STEP_IMAGE,
                "args": ["build", "--network", "cloudbuild", "-t", image, "."],
            }
        ],
        "images": [image],
        "logsBucket": f"gs://{bucket}/{LOGS_PREFIX}",
        "timeout": f"{max(1, math.ceil(timeout))}s",
    }


def is_terminal(status: str) -> bool:
    """Whether a build with this ``status`` has finished."""
    return status in TERMINAL_STATUSES


def build_from_operation(operation: Mapping[str, Any]) -> dict[str, Any]:
    """The ``Build`` in a create-build Operation's ``metadata``, with a usable ``id``.

    :raises ImageBuildError: the reply holds no build or no valid build id.
    """
    metadata = operation.get("metadata")
    build = metadata.get("build") if isinstance(metadata, Mapping) else None
    if not isinstance(build, dict):
        raise ImageBuildError(f"Cloud Build answered without a build: {dict(operation)!r:.500}")
    build_id = build.get("id")
    if not isinstance(build_id, str) or not _BUILD_ID.fullmatch(build_id):
        # The id goes into a URL path and a storage key.
        raise ImageBuildError(f"Cloud Build answered with an invalid build id {build_id!r}")
    return build


def failing_step(build: Mapping[str, Any]) -> str | None:
    """``step N: name args...`` for the first step whose status is FAILURE, or None."""
    steps = build.get("steps")
    if not isinstance(steps, list):
        return None
    for index, step in enumerate(steps):
        if isinstance(step, Mapping) and step.get("status") == "FAILURE":
            args = step.get("args")
            words = [str(step.get("name", "?"))]
            if isinstance(args, list):
                words += [str(a) for a in args]
            label = f" ({step['id']})" if step.get("id") else ""
            return f"step {index}{label}: {shlex.join(words)}"
    return None


def failure_message(image: str, build: Mapping[str, Any], log_tail: Sequence[str]) -> str:
    """The message of the ImageBuildError for a build that ended without SUCCESS.

    Names the image, the build id, the status, ``statusDetail``, ``failureInfo``, the
    failing step and the log URL, and ends with ``log_tail``.
    """
    status = build.get("status", "STATUS_UNKNOWN")
    lines = [f"Cloud Build {build.get('id', '?')} of {image} ended with status {status}"]
    if build.get("statusDetail"):
        lines.append(f"detail: {build['statusDetail']}")
    info = build.get("failureInfo")
    if isinstance(info, Mapping) and (info.get("detail") or info.get("type")):
        kind = f"{info['type']}: " if info.get("type") else ""
        lines.append(f"failure: {kind}{info.get('detail', '')}")
    step = failing_step(build)
    if step is not None:
        lines.append(f"failing {step}")
    if build.get("logUrl"):
        lines.append(f"log: {build['logUrl']}")
    lines.append(_tail_block(log_tail))
    return "\n".join(lines)


def _tail_block(log_tail: Sequence[str]) -> str:
    if not log_tail:
        return "(no build log was written)"
    return f"--- last {len(log_tail)} line(s) of the build log ---\n" + "\n".join(log_tail)


@dataclass
class LogLines:
    """Splits successive snapshots of a growing log into new lines (sans-IO).

    Each :meth:`feed` takes the whole log as read so far and returns the complete
    lines not returned before; an unterminated last line is held back until it is
    complete, or until a ``final`` feed. :attr:`tail` keeps the last
    :data:`LOG_TAIL_LINES` lines returned.
    """

    consumed: int = 0
    tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=LOG_TAIL_LINES)
    )

    def feed(self, data: bytes, *, final: bool = False) -> list[str]:
        """The new lines in ``data`` (decoded as UTF-8, invalid bytes replaced)."""
        new = data[self.consumed :]  # empty when the log is shorter than before
        if not final:
            new = new[: new.rfind(b"\n") + 1]
        self.consumed += len(new)
        parts = new.split(b"\n")
        if parts[-1] == b"":
            parts.pop()
        lines = [p.decode("utf-8", "replace").removesuffix("\r") for p in parts]
        self.tail.extend(lines)
        return lines


# -- the builder ---------------------------------------------------------------------


@dataclass
class _Run:
    """What one build_and_push call knows so far (for its error messages)."""

    image: str
    build_id: str | None = None
    finished: bool = False
    log: LogLines = field(default_factory=LogLines)


class CloudBuildBuilder:
    """:class:`~kinetic._images.builder.ImageBuilder` on Google Cloud Build.

    :param project: the GCP project the builds run in.
    :param storage: the store on ``bucket`` (normally the jobs bucket's
        :class:`~kinetic._storage.gcs.GCSStorage`): the source is uploaded and the log
        read through it. Borrowed, never closed.
    :param bucket: the name of the bucket ``storage`` is on; Cloud Build reads the
        source from it and writes the log to it.
    :param token: returns an access token; by default one
        :class:`gcloud.aio.auth.Token` per call (application default credentials, the
        cloud-platform scope), which needs the asyncio backend.
    :param base_url: the Cloud Build API's root (tests: a loopback server's).
    :param poll_interval: seconds between two polls of a running build.
    :param attempts: tries per request, the first included, for transient faults.
    :param backoff: upper bound of the first back-off in seconds, doubling per retry
        (full jitter); by default half of ``poll_interval``.
    :param max_backoff: cap on one back-off sleep; by default 15 × ``poll_interval``.
    :param install: the install path its contexts are made for: ``index`` (the
        default: hashed requirement files, installed from the package index inside
        the build) or ``wheels``.
    :raises ConfigError: on an empty project or bucket, or a non-positive option.
    """

    def __init__(
        self,
        project: str,
        storage: Storage,
        bucket: str,
        *,
        token: TokenSource | None = None,
        base_url: str = DEFAULT_BASE_URL,
        poll_interval: float = 2.0,
        attempts: int = 5,
        backoff: float | None = None,
        max_backoff: float | None = None,
        install: str = "index",
    ) -> None:
        if not project or "/" in project:
            raise ConfigError(f"invalid GCP project {project!r}")
        if not bucket or "/" in bucket or bucket.startswith("gs:"):
            raise ConfigError(f"invalid bucket name {bucket!r}")
        if poll_interval <= 0 or attempts < 1:
            raise ConfigError("poll_interval must be > 0 and attempts >= 1")
        self._project = project
        self._install = install
        self._storage = storage
        self._bucket = bucket
        self._token = token
        self._base_url = base_url.rstrip("/")
        self._poll_interval = poll_interval
        self._attempts = attempts
        self._backoff = poll_interval / 2 if backoff is None else backoff
        self._max_backoff = poll_interval * 15 if max_backoff is None else max_backoff
        if self._backoff < 0 or self._max_backoff < 0:
            raise ConfigError("backoff and max_backoff must be >= 0")

    def __repr__(self) -> str:
        return f"CloudBuildBuilder(project={self._project!r}, bucket={self._bucket!r})"

    @property
    def name(self) -> str:
        """``cloudbuild``."""
        return "cloudbuild"

    @property
    def install(self) -> str:
        """The install path its contexts are made for: ``index`` or ``wheels``."""
        return self._install

    async def build_and_push(
        self,
        context: bytes,
        image: str,
        *,
        progress: Progress | None = None,
        timeout: float = BUILD_TIMEOUT,
    ) -> None:
        """Build ``context`` on Cloud Build and push it as ``image``.

        ``progress`` receives each line of the build log, in order, once (on this
        task, never from another thread); an exception it raises cancels the remote
        build and propagates unchanged.

        :param timeout: seconds for the whole call: upload, submit, build, push and
            log. When it runs out the remote build is cancelled (best effort).
        :raises ImageBuildError: the upload, a request or the build failed, the build
            ended without SUCCESS (the message ends with the log tail), or ``timeout``
            ran out.

        Cancelling the call cancels the remote build (best effort, shielded, at most
        :data:`CANCEL_TIMEOUT` seconds) and then propagates the cancellation.
        """
        run = _Run(image)
        try:
            with anyio.fail_after(timeout):
                await self._run(run, context, progress, timeout)
        except TimeoutError as exc:
            where = f" (build {run.build_id}, cancelled)" if run.build_id else ""
            raise ImageBuildError(
                f"Cloud Build of {image} timed out after {timeout:g}s{where}\n"
                + _tail_block(list(run.log.tail))
            ) from exc

    async def _run(
        self, run: _Run, context: bytes, progress: Progress | None, timeout: float
    ) -> None:
        # Credentials first: a missing credentials file fails before a large upload.
        async with (
            self._token_source() as token,
            HttpClient(
                error=ImageBuildError,
                prefix="Cloud Build: ",
                base_url=self._base_url,
                attempts=self._attempts,
                backoff=self._backoff,
                max_backoff=self._max_backoff,
                attempt_timeout=REQUEST_TIMEOUT,
            ) as client,
        ):
            source = await self._upload(run, context, timeout)
            body = build_request(
                run.image, bucket=self._bucket, source_object=source, timeout=timeout
            )
            operation = await self._call(
                client, token, "POST", self._builds_path(), f"submit the build of {run.image}", body
            )
            build = build_from_operation(operation)
            run.build_id = build["id"]
            try:
                build = await self._follow(client, token, run, build, progress)
            except BaseException:
                if not run.finished:
                    await self._cancel_remote(client, token, run)
                raise
        if build.get("status") != "SUCCESS":
            raise ImageBuildError(failure_message(run.image, build, list(run.log.tail)))

    async def _upload(self, run: _Run, context: bytes, timeout: float) -> str:
        key = source_key(context)
        # Fixed mtime: the same context always gives the same object.
        data = await anyio.to_thread.run_sync(lambda: gzip.compress(context, mtime=0))
        try:
            await self._storage.write(key, data, timeout=timeout)
        except StorageError as exc:
            raise ImageBuildError(
                f"uploading the build context of {run.image} to gs://{self._bucket}/{key} "
                f"failed: {exc}"
            ) from exc
        return key

    async def _follow(
        self,
        client: HttpClient,
        token: TokenSource,
        run: _Run,
        build: dict[str, Any],
        progress: Progress | None,
    ) -> dict[str, Any]:
        """Poll until the build's status is terminal; stream the log; return the build."""
        assert run.build_id is not None
        path = f"{self._builds_path()}/{run.build_id}"
        while not is_terminal(str(build.get("status", "STATUS_UNKNOWN"))):
            if progress is not None:  # without a listener the log is read once, at the end
                await self._pump_log(run, progress, final=False)
            await anyio.sleep(self._poll_interval)
            build = await self._call(client, token, "GET", path, f"get build {run.build_id}")
        run.finished = True
        await self._pump_log(run, progress, final=True)
        return build

    async def _pump_log(self, run: _Run, progress: Progress | None, *, final: bool) -> None:
        """Read the log object and pass its new lines on. A missing log is no log yet;
        other storage failures are logged and skipped (the log is informative only)."""
        assert run.build_id is not None
        try:
            data = await self._storage.read(log_key(run.build_id), timeout=LOG_READ_TIMEOUT)
        except ObjectNotFoundError:
            return
        except StorageError as exc:
            log.warning("reading the log of Cloud Build %s failed: %s", run.build_id, exc)
            return
        for line in run.log.feed(data, final=final):
            if progress is not None:
                progress(line)

    async def _cancel_remote(self, client: HttpClient, token: TokenSource, run: _Run) -> None:
        """Cancel the remote build, best effort: shielded, bounded, never raises."""
        path = f"{self._builds_path()}/{run.build_id}:cancel"
        body = {"projectId": self._project, "id": run.build_id}
        with anyio.move_on_after(CANCEL_TIMEOUT, shield=True):
            try:
                await self._call(client, token, "POST", path, f"cancel build {run.build_id}", body)
            except ImageBuildError as exc:
                log.warning("could not cancel Cloud Build %s: %s", run.build_id, exc)

    # -- the HTTP boundary -------------------------------------------------------------

    def _builds_path(self) -> str:
        return f"/v1/projects/{quote(self._project, safe='')}/builds"

    async def _call(
        self,
        client: HttpClient,
        token: TokenSource,
        method: str,
        path: str,
        what: str,
        body: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Send one request under the edge's rules (retries, translation); return the
        JSON object answered.

        :raises ImageBuildError: an HTTP error (after retries for transient ones), a
            transport failure after ``attempts`` tries, no token, or a reply that is
            not a JSON object.
        """
        return await client.request(
            method,
            path,
            what=what,
            token=token,
            answer=lambda reply: _answer(reply, what),
            timeout=None,  # the build's own deadline bounds every call
            json=body,
        )

    @contextlib.asynccontextmanager
    async def _token_source(self) -> AsyncIterator[TokenSource]:
        """The injected token source, or the Google auth library's for this call."""
        if self._token is not None:
            yield self._token
            return
        try:
            async with google_token_source() as get:
                yield get
        except ImageBuildError:
            raise
        except BackendError as exc:  # no credentials, on entry or at a refresh
            raise ImageBuildError(f"Cloud Build: {exc}") from exc


def _answer(reply: Reply, what: str) -> dict[str, Any]:
    """The JSON object answered; :class:`Transient` for 429 and 5xx.

    :raises ImageBuildError: any other HTTP error, or an answer that is not a JSON object.
    """
    if reply.status >= 400:
        error = f"HTTP {reply.status} {_error_detail(reply)}".rstrip()
        if reply.status == 429 or reply.status >= 500:
            raise Transient(error)
        raise ImageBuildError(f"Cloud Build: {what} failed: {error}")
    try:
        data = reply.json()
    except ValueError as exc:
        raise ImageBuildError(f"Cloud Build: {what} answered non-JSON") from exc
    if not isinstance(data, dict):
        raise ImageBuildError(f"Cloud Build: {what} answered {data!r:.200}")
    return data


def _error_detail(reply: Reply) -> str:
    """Google's ``{"error": {"code", "message", "status"}}``, or the start of the body."""
    try:
        error = reply.json().get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, Mapping) and error.get("message"):
        status = f"{error['status']}: " if error.get("status") else ""
        return f"{status}{error['message']}"
    return reply.text[:500].strip()
