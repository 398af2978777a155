"""The dashboard's routes: who may ask (the token, the Host, the origin of a POST), and
the pages and event streams they get.

Access: the server listens on 127.0.0.1 only, and answers connections of its own uid
only (:class:`runner.peer.Gate`, in :func:`kinetic._dashboard.serve`). Every request
carries the token (query ``t``, or form field ``t`` of a POST), compared in constant
time; a wrong or missing one gets 403 before anything is read. The Host header must
name the loopback address and port (a DNS-rebinding page gets 403). A POST (cancel) must also come from the
dashboard's own origin (``Origin``/``Sec-Fetch-Site``, when the browser sends them)
as an urlencoded form; cancels go through a confirm page first.

Routes (all GET but the cancels)::

    /                                   single jobs (``?state=FAILED`` filters)
    /jobs/{id}   /jobs/{id}/events      a job; its log and status, live (SSE)
    /batches                            recorded batches
    /batches/{g} /batches/{g}/events    a batch (``?offset=N``: a region of inputs)
    /batches/{g}/inputs/{i}[/events]    an input of a batch, and its log
    .../cancel                          GET: the confirm step; POST: cancel
"""

from __future__ import annotations

import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from html import escape

import anyio

from kinetic._dashboard import pages
from kinetic._dashboard.http import EventStream, Request, Response
from kinetic._dashboard.pages import link
from kinetic._dashboard.source import BatchWatch, Source, parse_time
from kinetic._engine.handle import JobHandle
from kinetic._exceptions import ConfigError, JobNotFoundError, KineticError

BATCH_EVERY = 1.0  # seconds between a batch page's updates
LOG_EVERY = 1.0  # seconds between reads of a batch input's log while it runs
STATES = ("PENDING", "RUNNING", "SUCCEEDED", "FAILED", "NOT_FOUND", "UNKNOWN")


def _text(status: int, message: str) -> Response:
    return Response(status, (message + "\n").encode(), "text/plain; charset=utf-8")


class App:
    """The request handler of one dashboard."""

    def __init__(self, source: Source, token: str, port: int = 0) -> None:
        self.source = source
        self.token = token
        self.port = port

    # -- access -------------------------------------------------------------------------

    def _token_ok(self, given: str | None) -> bool:
        if not given:
            return False
        return hmac.compare_digest(given.encode(), self.token.encode())

    def _host_ok(self, request: Request) -> bool:
        host = request.headers.get("host", "")
        return host in (f"127.0.0.1:{self.port}", f"localhost:{self.port}")

    def _same_origin(self, request: Request) -> bool:
        site = request.headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            return False
        origin = request.headers.get("origin")
        if origin is not None and origin != f"http://{request.headers.get('host', '')}":
            return False
        kind = request.headers.get("content-type", "").split(";")[0].strip()
        return kind == "application/x-www-form-urlencoded"

    async def handle(self, request: Request) -> Response | EventStream:
        if request.method not in ("GET", "POST"):
            return _text(405, "only GET, and POST for a cancel")
        given = request.form().get("t") if request.method == "POST" else request.query.get("t")
        if not self._token_ok(given) or not self._host_ok(request):
            return _text(403, "forbidden: open the URL `kinetic dashboard` printed (with ?t=)")
        if request.method == "POST" and not self._same_origin(request):
            return _text(403, "forbidden: a cancel must come from the dashboard's own page")
        parts = [p for p in request.path.split("/") if p]
        try:
            return await self._route(request, parts)
        except (JobNotFoundError, ConfigError) as exc:
            return _text(404, str(exc))

    async def _route(self, request: Request, parts: list[str]) -> Response | EventStream:
        post = request.method == "POST"
        if not parts:
            return await self.jobs_page(request.query.get("state", ""))
        if parts[-1] == "cancel":
            return await self.cancel(parts[:-1], post)
        if post:
            return _text(405, "only a cancel is posted")
        match parts:
            case ["batches"]:
                return await self.batches_page()
            case ["jobs", job_id]:
                return await self.job_page(job_id)
            case ["jobs", job_id, "events"]:
                return EventStream(self.job_events(await self.source.job(job_id)))
            case ["batches", group_id]:
                return await self.batch_page(group_id, _int(request.query.get("offset")))
            case ["batches", group_id, "events"]:
                watch = await self.source.batch(group_id)
                offset = _int(request.query.get("offset"))
                return EventStream(self.batch_events(watch, offset))
            case ["batches", group_id, "inputs", index]:
                return await self.job_page(await self._input_id(group_id, index))
            case ["batches", group_id, "inputs", index, "events"]:
                job = await self.source.job(await self._input_id(group_id, index))
                return EventStream(self.job_events(job))
        return _text(404, "no such page")

    async def _input_id(self, group_id: str, index: str) -> str:
        watch = await self.source.batch(group_id)
        i = _int(index, -1)
        if not 0 <= i < watch.progress.total:
            raise JobNotFoundError(f"batch {group_id} has no input {index}")
        return watch.job(i).job_id

    # -- jobs -----------------------------------------------------------------------------

    async def jobs_page(self, state: str) -> Response:
        found = await self.source.jobs()
        now = time.time()
        rows = []
        counts: dict[str, int] = {}
        for handle, report in found:
            status = _status(report)
            counts[status] = counts.get(status, 0) + 1
            if state and status != state:
                continue
            created = parse_time(handle.created_at)
            ended = await self._ended_at(handle.job_id, status)
            duration = (ended if ended is not None else now) - created if created else None
            rows.append(
                [
                    _a(f"/jobs/{handle.job_id}", self.token, handle.job_id),
                    f'<span class="st {status}">{status}</span>',
                    escape(handle.func_name or ""),
                    escape(handle.accelerator or ""),
                    escape(handle.backend or ""),
                    pages.human_seconds(now - created if created else None),
                    pages.human_seconds(duration),
                ]
            )
        filters = [f'<a href="{link("/", self.token)}">all ({len(found)})</a>']
        filters += [
            f'<a href="{link("/", self.token, state=s)}">{s.lower()} ({counts[s]})</a>'
            for s in STATES
            if counts.get(s)
        ]
        title = f"Jobs{f' · {state}' if state else ''}"
        body = (
            f"<h1>{escape(title)}</h1><p><small>{escape(self.source.storage_url)}</small></p>"
            f'<nav class="filter">{" ".join(filters)}</nav>'
            + pages.table(
                ("job", "state", "function", "accelerator", "backend", "age", "duration"),
                rows,
                ident="jobs",
            )
        )
        return Response(200, pages.page(title, body, self.token))

    async def _ended_at(self, job_id: str, status: str) -> float | None:
        if status not in ("SUCCEEDED", "FAILED"):
            return None
        when = await self.source.finished_at(job_id)
        if when is None:
            seen = self.source.history.get(job_id, [])
            when = parse_time(seen[-1].at) if seen else None
        return when

    async def job_page(self, job_id: str) -> Response:
        source = self.source
        handle = await source.job(job_id)
        report = await source.status(handle)
        status = _status(report)
        is_input = handle.group_id is not None
        base = (
            f"/batches/{handle.group_id}/inputs/{handle.group_index}"
            if is_input
            else f"/jobs/{job_id}"
        )
        facts = [
            ("job", escape(job_id)),
            ("function", escape(handle.func_name or "")),
            ("accelerator", escape(handle.accelerator or "")),
            ("backend", escape(handle.backend or "")),
            ("created", escape(handle.created_at or "")),
        ]
        if is_input:
            batch = link(f"/batches/{handle.group_id}", self.token)
            facts.append(("batch", f'<a href="{batch}">{escape(str(handle.group_id))}</a>'))
            facts.append(("input", str(handle.group_index)))
        cancel = f'<div id="actions">{self._job_actions(base, status)}</div>'
        body = (
            f"<h1>{escape(job_id)}</h1>"
            + pages.table(("", ""), [[k, v] for k, v in facts])
            + f'<h2>Status</h2><div id="status">{self._status_html(handle, report)}</div>'
            + f'<h2>Result</h2><div id="result">{await self._result_html(handle, status)}</div>'
            + cancel
            + '<h2>Log <small id="live">following…</small></h2><pre id="log"></pre>'
        )
        return Response(
            200,
            pages.page(job_id, body, self.token, events=link(base + "/events", self.token)),
        )

    def _job_actions(self, base: str, status: str) -> str:
        if status not in ("PENDING", "RUNNING"):
            return ""
        href = link(base + "/cancel", self.token)
        return f'<p><a href="{href}" id="cancel">Cancel this job…</a></p>'

    def _status_html(self, handle: JobHandle, report: object) -> str:
        status = _status(report)
        reason = getattr(report, "reason", None) if not isinstance(report, KineticError) else report
        rows = [[escape(handle.created_at or ""), "created", ""]]
        rows += [
            [escape(s.at), f'<span class="st {s.status}">{s.status}</span>', escape(s.reason or "")]
            for s in self.source.history.get(handle.job_id, [])
        ]
        return (
            f'<p><span class="st {status}" id="state">{status}</span> '
            f"{escape(str(reason or ''))}</p>"
            + pages.table(("first seen", "status", "detail"), rows, ident="history")
        )

    async def _result_html(self, handle: JobHandle, status: str) -> str:
        if status not in ("SUCCEEDED", "FAILED"):
            return "<p><small>none yet</small></p>"
        info = await self.source.result_info(handle)
        if info is None:
            return "<p><small>no result recorded</small></p>"
        kind, size = info
        return (
            f'<p>type <code id="result-type">{escape(kind)}</code>, {pages.human_bytes(size)}</p>'
        )

    async def job_events(self, handle: JobHandle) -> AsyncIterator[tuple[str, object]]:
        """The job's log as it grows, then its final status and result."""
        if handle.group_id is None:
            async for chunk in handle.iter_logs():
                yield ("log", chunk)
        else:
            # A batch input's output is cut out of its worker's log (no stream of its
            # own): read while it runs, at most a tenth of the time, and once at its end.
            sent, took = 0, 0.0
            while True:
                report = await self.source.status(handle)
                status = _status(report)
                if status != "PENDING":
                    began = time.monotonic()
                    text = await handle.logs() or ""
                    took = time.monotonic() - began
                    if len(text) > sent:
                        yield ("log", text[sent:])
                        sent = len(text)
                if status not in ("PENDING", "RUNNING"):
                    break
                await anyio.sleep(max(LOG_EVERY, 10 * took))
        report = await self.source.status(handle)
        # A pod's log stream ends with its container; the Job's status follows a moment
        # later. Wait for it (an UNKNOWN status is not waited for).
        while _status(report) in ("PENDING", "RUNNING"):
            await anyio.sleep(LOG_EVERY)
            report = await self.source.status(handle)
        status = _status(report)
        yield (
            "html",
            {
                "status": self._status_html(handle, report),
                "result": await self._result_html(handle, status),
                "actions": "",
            },
        )
        yield ("end", f"ended: {status}")

    # -- batches --------------------------------------------------------------------------

    async def batches_page(self) -> Response:
        found = await self.source.batches()
        now = time.time()
        rows = [
            [
                _a(f"/batches/{m['group_id']}", self.token, str(m["group_id"])),
                escape(str(m.get("name") or "")),
                escape(str(m.get("func_name") or "")),
                str(m.get("total")),
                pages.human_seconds(now - t if (t := parse_time(m["created_at"])) else None),
            ]
            for m in found
        ]
        body = "<h1>Batches</h1>" + pages.table(
            ("batch", "name", "function", "inputs", "age"), rows, ident="batches"
        )
        return Response(200, pages.page("Batches", body, self.token))

    def _batch_parts(self, watch: BatchWatch, offset: int) -> dict[str, str]:
        p, gid, token = watch.progress, watch.group_id, self.token
        return {
            "summary": pages.batch_summary(p, p.rate()),
            "chart": pages.chart(p.samples, p.total),
            "failures": pages.failures(p, gid, token),
            "slowest": pages.slowest(p.slowest(time.monotonic()), gid, token),
            "inputs": pages.grid(p, gid, token, offset),
            "actions": self._batch_actions(watch),
        }

    def _batch_actions(self, watch: BatchWatch) -> str:
        if watch.progress.finished:
            return ""
        href = link(f"/batches/{watch.group_id}/cancel", self.token)
        return f'<p><a href="{href}" id="cancel">Cancel this batch…</a></p>'

    async def batch_page(self, group_id: str, offset: int) -> Response:
        watch = await self.source.batch(group_id)
        await watch.refresh()
        offset = max(0, min(offset, max(0, watch.progress.total - 1)))
        parts = self._batch_parts(watch, offset)
        m = watch.manifest
        name = m.get("name")
        title = f"{group_id} ({name})" if name else group_id
        cancel = f'<div id="actions">{parts["actions"]}</div>'
        body = (
            f"<h1>{escape(title)}</h1><p><small>{escape(m.get('func_name', ''))} · "
            f"{escape(m.get('created_at', ''))}</small></p>"
            + f'<div id="summary">{parts["summary"]}</div>{cancel}'
            + f'<h2>Progress</h2><div id="chart">{parts["chart"]}</div>'
            + f'<h2>Failures</h2><div id="failures">{parts["failures"]}</div>'
            + f'<h2>Slowest inputs</h2><div id="slowest">{parts["slowest"]}</div>'
            + f'<h2>Inputs</h2><div id="inputs">{parts["inputs"]}</div>'
            + '<p><small id="live">live</small></p>'
        )
        events = link(f"/batches/{group_id}/events", self.token, offset=offset)
        return Response(200, pages.page(title, body, self.token, events=events))

    async def batch_events(
        self, watch: BatchWatch, offset: int
    ) -> AsyncIterator[tuple[str, object]]:
        while True:
            await watch.refresh()
            yield ("html", self._batch_parts(watch, offset))
            if watch.progress.finished:
                yield ("end", "finished")
                return
            await anyio.sleep(BATCH_EVERY)

    # -- cancel ---------------------------------------------------------------------------

    async def cancel(self, parts: list[str], post: bool) -> Response:
        act: Callable[[str], Awaitable[None]]
        match parts:
            case ["jobs", job_id]:
                what, back = f"job {job_id}", f"/jobs/{job_id}"
                act = self.source.cancel_job
                arg = job_id
            case ["batches", group_id]:
                await self.source.batch(group_id)
                what, back = f"batch {group_id} (every input not finished)", f"/batches/{group_id}"
                act = self.source.cancel_batch
                arg = group_id
            case ["batches", group_id, "inputs", index]:
                arg = await self._input_id(group_id, index)
                what, back = (
                    f"input {index} of batch {group_id}",
                    f"/batches/{group_id}/inputs/{index}",
                )
                act = self.source.cancel_job
            case _:
                return _text(404, "no such page")
        if not post:
            body = pages.confirm(
                f"Cancel {what}?", back + "/cancel", link(back, self.token), self.token
            )
            return Response(200, pages.page("Cancel?", body, self.token))
        await act(arg)
        return Response(
            303, b"", headers={"Location": link(back, self.token).replace("&amp;", "&")}
        )


def _a(path: str, token: str, text: str) -> str:
    return f'<a href="{link(path, token)}">{escape(text)}</a>'


def _status(report: object) -> str:
    if isinstance(report, KineticError):
        return "UNKNOWN"
    status = getattr(report, "status", None)
    return str(getattr(status, "value", "UNKNOWN"))


def _int(text: str | None, default: int = 0) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default
