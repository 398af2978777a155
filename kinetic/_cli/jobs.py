"""``kinetic jobs`` and ``kinetic batch``: look after jobs and batches from a shell.

    kinetic jobs list [--limit N] [--json]        newest first, with their status
    kinetic jobs list --batch GROUP_ID [--offset N] [--limit N] [--json]
                                                  a page of a batch's inputs (100)
    kinetic jobs status JOB_ID [--json]           status, with the reason when it failed
    kinetic jobs logs JOB_ID [-f]                 output so far (-f: follow until it ends)
    kinetic jobs tail JOB_ID [-n N]               the last N lines of output
    kinetic jobs result JOB_ID [--timeout S] [--json] [--cleanup]
                                                  wait for the value (repr, or JSON)
    kinetic jobs cancel JOB_ID
    kinetic jobs cleanup JOB_ID
    kinetic jobs debug JOB_ID [--port P]        attach a debugger to a debug job
                                                  (:mod:`kinetic._cli.jobs_debug`)
    kinetic batch list [--json]                   recorded batches, newest first
    kinetic batch status GROUP_ID [--watch [--timeout S]] [--json]
    kinetic batch results GROUP_ID [--timeout S] [--json] [--cleanup]
    kinetic batch cancel GROUP_ID
    kinetic batch cleanup GROUP_ID

Jobs are found where the settings point (``--backend``/``--project``/``--cluster``
before the group, then ``KINETIC_*``, then the profile), as ``kinetic.attach`` finds
them. Looking never deletes: ``result`` and ``results`` keep what they read unless
``--cleanup``. ``batch status --watch`` and ``batch results`` draw a live progress bar
on a terminal (stderr) while the batch runs. Exit statuses are those of
:mod:`kinetic._cli._output`; ``status`` exits 1 for a failed job (or a batch with a
failed input), and ``result``/``results`` exit 1 when the job (or any input) raised.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import TYPE_CHECKING, Any

from kinetic._cli import jobs_debug
from kinetic._cli._output import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    emit_json,
    report_error,
    table,
)
from kinetic._concurrency import for_each
from kinetic._exceptions import ConfigError, KineticError

if TYPE_CHECKING:
    from kinetic._core.status import StatusReport
    from kinetic._engine.handle import JobHandle as AioJobHandle

_LIST_CONCURRENCY = 16
BATCH_PAGE = 100
"""Inputs ``jobs list --batch`` shows unless ``--limit`` says otherwise."""


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``jobs`` and ``batch`` command groups."""
    jobs = sub.add_parser("jobs", help="single jobs").add_subparsers(dest="action", required=True)
    listing = jobs.add_parser("list", help="recorded jobs, newest first")
    listing.add_argument(
        "--limit", type=int, default=None, help=f"show N (default all; {BATCH_PAGE} with --batch)"
    )
    listing.add_argument("--batch", metavar="GROUP_ID", help="list this batch's inputs instead")
    listing.add_argument(
        "--offset", type=int, default=0, help="with --batch: the first input listed (default 0)"
    )
    _json_flag(listing)
    status = jobs.add_parser("status", help="a job's status (exit 1 when it failed)")
    status.add_argument("job_id")
    _json_flag(status)
    logs = jobs.add_parser("logs", help="a job's output")
    logs.add_argument("job_id")
    logs.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    tail = jobs.add_parser("tail", help="the last lines of a job's output")
    tail.add_argument("job_id")
    tail.add_argument("-n", "--lines", type=int, default=100, help="how many (default: 100)")
    result = jobs.add_parser("result", help="wait for a job's value")
    result.add_argument("job_id")
    _wait_flags(result)
    for action, text in (("cancel", "end a job"), ("cleanup", "delete a job's resources")):
        jobs.add_parser(action, help=text).add_argument("job_id")
    jobs_debug.add_parser(jobs)

    batch = sub.add_parser("batch", help="batches").add_subparsers(dest="action", required=True)
    _json_flag(batch.add_parser("list", help="recorded batches, newest first"))
    bstatus = batch.add_parser("status", help="counts per status (exit 1 if an input failed)")
    bstatus.add_argument("group_id")
    bstatus.add_argument("--watch", action="store_true", help="wait until the batch ends")
    bstatus.add_argument("--timeout", type=float, default=None, help="seconds --watch waits")
    _json_flag(bstatus)
    results = batch.add_parser("results", help="wait for every input's value")
    results.add_argument("group_id")
    _wait_flags(results)
    for action, text in (("cancel", "end a batch"), ("cleanup", "delete a batch's resources")):
        batch.add_parser(action, help=text).add_argument("group_id")


def _json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="JSON on stdout")


def _wait_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timeout", type=float, default=None, help="seconds to wait (exit 4)")
    p.add_argument("--cleanup", action="store_true", help="delete what was read")
    _json_flag(p)


def run(ns: argparse.Namespace) -> int:
    """Run a ``jobs`` or ``batch`` command; return the exit status."""
    try:
        if ns.group == "batch":
            return _batch(ns)
        return _jobs(ns)
    except KeyboardInterrupt:
        print("kinetic: interrupted (the job keeps running)", file=sys.stderr)
        return EXIT_INTERRUPTED
    except KineticError as exc:
        return report_error(exc)


def _where(ns: argparse.Namespace) -> dict[str, str | None]:
    return {"project": ns.project, "cluster": ns.cluster, "backend": ns.backend}


# --------------------------------------------------------------------------- jobs


def _jobs(ns: argparse.Namespace) -> int:
    import kinetic

    if ns.action == "list":
        return _list_jobs(ns)
    job = kinetic.attach(ns.job_id, **_where(ns))
    if ns.action == "status":
        report = job.status_report()
        if ns.json:
            emit_json(job_document(job.to_dict(), report))
        else:
            print(status_line(report))
        return EXIT_FAILED if report.status is kinetic.JobStatus.FAILED else EXIT_OK
    if ns.action == "logs":
        if ns.follow:
            for chunk in job.iter_logs():
                sys.stdout.write(chunk)
                sys.stdout.flush()
        else:
            sys.stdout.write(job.logs() or "")
        return EXIT_OK
    if ns.action == "tail":
        text = job.tail(ns.lines)
        sys.stdout.write(text if not text or text.endswith("\n") else text + "\n")
        return EXIT_OK
    if ns.action == "result":
        try:
            value = job.result(timeout=ns.timeout, cleanup=ns.cleanup, stream_logs=False)
        except KineticError:
            raise
        except Exception as exc:  # noqa: BLE001 - the job's own error, reported not raised
            return _job_raised(exc)
        if ns.json:
            emit_json(value)
        else:
            print(repr(value))
        return EXIT_OK
    if ns.action == "debug":
        return jobs_debug.run(ns, job)
    if ns.action == "cancel":
        job.cancel()
        print(f"cancelled {job.job_id}")
        return EXIT_OK
    job.cleanup()
    print(f"cleaned up {job.job_id}")
    return EXIT_OK


def status_line(report: StatusReport) -> str:
    """``jobs status``'s text: the status, then the phase that failed and why; for a job
    that retries, its attempt, and a line for each earlier failed attempt. Pure."""
    line = report.status.value
    if report.reason:
        where = f"in phase {report.phase}: " if report.phase else ""
        line += f"  ({where}{report.reason})"
    if report.attempt is not None:
        line += f"  attempt {report.attempt}"
    for earlier in report.attempts:
        ended = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(earlier.ended))
        line += (
            f"\n  attempt {earlier.number} failed at {ended} in phase {earlier.phase}: "
            f"{earlier.error}"
        )
    return line


def job_document(record: dict[str, Any], report: StatusReport | KineticError) -> dict[str, Any]:
    """A job's handle fields and status as one JSON-safe object (status ``UNKNOWN``
    and the error as its reason when the status could not be read). Pure."""
    if isinstance(report, KineticError):
        return {**record, "status": UNKNOWN, "reason": str(report), "phase": None}
    return {
        **record,
        "status": report.status.value,
        "reason": report.reason,
        "phase": report.phase,
        "cancelled": report.cancelled,
        "attempt": report.attempt,
        "attempts": [dataclasses.asdict(a) for a in report.attempts],
    }


def _list_jobs(ns: argparse.Namespace) -> int:
    from kinetic._sync.portal import call

    if ns.batch is None and ns.offset:
        raise ConfigError("--offset pages a batch's inputs: give --batch GROUP_ID too")
    limit = BATCH_PAGE if ns.batch is not None and ns.limit is None else ns.limit
    page = (ns.batch, ns.offset, limit) if ns.batch is not None else None
    found, total = call(
        _jobs_with_status, ns.project, ns.zone, ns.cluster, ns.namespace, ns.backend, page
    )
    if ns.batch is None and ns.limit is not None:
        found = found[: max(0, ns.limit)]
    shown_to = ns.offset + len(found)
    if ns.batch is not None and shown_to < total:
        print(
            f"kinetic: inputs {ns.offset}-{shown_to - 1} of {total}; "
            f"--offset {shown_to} for the next page",
            file=sys.stderr,
        )
    # A status that cannot be read is that row's problem: the others are still shown.
    unreadable = [(h, r) for h, r in found if isinstance(r, KineticError)]
    for h, exc in unreadable:
        print(f"kinetic: job {h.job_id}: its status cannot be read: {exc}", file=sys.stderr)
    code = EXIT_FAILED if unreadable else EXIT_OK
    if ns.json:
        emit_json([job_document(h.to_dict(), r) for h, r in found])
        return code
    rows = [
        [
            h.job_id,
            _status_text(r),
            h.func_name,
            h.backend,
            h.accelerator,
            h.created_at,
            h.group_id,
        ]
        for h, r in found
    ]
    table(
        ("job", "status", "function", "backend", "accelerator", "created", "batch"),
        rows,
        title="jobs",
        styles=[_style(_status_text(r)) for _, r in found],
    )
    return code


UNKNOWN = "UNKNOWN"
"""The status column of a job whose status could not be read."""


def _status_text(report: StatusReport | KineticError) -> str:
    return UNKNOWN if isinstance(report, KineticError) else report.status.value


async def _jobs_with_status(
    project: str | None,
    zone: str | None,
    cluster: str | None,
    namespace: str | None,
    backend: str | None,
    page: tuple[str, int, int | None] | None = None,
) -> tuple[list[tuple[AioJobHandle, StatusReport | KineticError]], int]:
    """Every recorded job with its status, read concurrently (newest first), and how
    many there are; with ``page`` (group id, offset, limit), that page of a batch's
    inputs and the batch's number of inputs. A status that cannot be read is given as
    the error that said so.

    :raises KineticError: the jobs could not be listed.
    """

    from kinetic import aio

    if page is None:
        handles = await aio.list_jobs(project, zone, cluster, namespace, backend)
        total = len(handles)
    else:
        from kinetic._engine.remote import list_batch_page

        group_id, offset, limit = page
        handles, total = await list_batch_page(
            project, zone, cluster, namespace, backend, batch=group_id, offset=offset, limit=limit
        )
    reports: dict[str, StatusReport | KineticError] = {}

    async def one(h: AioJobHandle) -> None:
        try:
            reports[h.job_id] = await h.status_report()
        except KineticError as exc:
            reports[h.job_id] = exc

    await for_each(handles, one, limit=_LIST_CONCURRENCY)
    return [(h, reports[h.job_id]) for h in handles], total


def _job_raised(exc: BaseException) -> int:
    print(f"kinetic: the job raised {type(exc).__name__}: {exc}", file=sys.stderr)
    for note in getattr(exc, "__notes__", ()):
        print(note, file=sys.stderr)
    return EXIT_FAILED


def _style(status: str) -> str | None:
    return {"FAILED": "red", "SUCCEEDED": "green", "RUNNING": "cyan"}.get(status)


# --------------------------------------------------------------------------- batches


def _batch(ns: argparse.Namespace) -> int:
    import kinetic

    if ns.action == "list":
        return _list_batches(ns)
    batch = kinetic.attach_batch(
        ns.group_id, project=ns.project, cluster=ns.cluster, backend=ns.backend
    )
    if ns.action == "status":
        if ns.watch:
            batch.wait(timeout=ns.timeout)  # draws the progress bar on a terminal
        counts = batch.status_counts()
        if ns.json:
            emit_json(
                {"group_id": batch.group_id, "name": batch.name, "total": batch.total, **counts}
            )
        else:
            table(("status", "inputs"), sorted(counts.items()), title=batch.group_id)
        return EXIT_FAILED if counts.get("FAILED") else EXIT_OK
    if ns.action == "results":
        values = batch.results(timeout=ns.timeout, cleanup=ns.cleanup, return_exceptions=True)
        docs = results_document(values)
        if ns.json:
            emit_json(docs)
        else:
            rows = [
                [d["index"], "ok" if d["ok"] else "error", d.get("value", d.get("error"))]
                for d in docs
            ]
            table(("input", "outcome", "value"), rows, title=batch.group_id)
        return EXIT_OK if all(d["ok"] for d in docs) else EXIT_FAILED
    if ns.action == "cancel":
        batch.cancel()
        print(f"cancelled {batch.group_id}")
        return EXIT_OK
    batch.cleanup()
    print(f"cleaned up {batch.group_id}")
    return EXIT_OK


def results_document(values: list[Any]) -> list[dict[str, Any]]:
    """Per input: ``{"index", "ok", "value"}`` or ``{"index", "ok": false, "error",
    "type"[, "notes"]}`` (notes: the remote traceback), for the list
    ``results(return_exceptions=True)`` returns. Pure."""
    docs: list[dict[str, Any]] = []
    for i, value in enumerate(values):
        if isinstance(value, BaseException):
            doc = {
                "index": i,
                "ok": False,
                "error": f"{type(value).__name__}: {value}",
                "type": type(value).__name__,
            }
            notes = getattr(value, "__notes__", None)
            if notes:  # the remote traceback, as the job's process saw it
                doc["notes"] = "\n".join(str(n) for n in notes)
            docs.append(doc)
        else:
            docs.append({"index": i, "ok": True, "value": value})
    return docs


def _list_batches(ns: argparse.Namespace) -> int:
    from kinetic._sync.portal import call

    manifests = call(_batch_manifests, ns.backend, ns.project, ns.cluster)
    if ns.json:
        emit_json(manifests)
        return EXIT_OK
    rows = [
        [m["group_id"], m.get("name"), m.get("func_name"), m.get("total"), m.get("created_at")]
        for m in manifests
    ]
    table(("batch", "name", "function", "inputs", "created"), rows, title="batches")
    return EXIT_OK


async def _batch_manifests(
    backend: str | None, project: str | None, cluster: str | None
) -> list[dict[str, Any]]:
    """The committed batches where the settings point, newest first
    (:func:`kinetic._engine.batch_listing.batch_summaries`).

    :raises StorageError: a listing or a read the storage refused.
    """
    from kinetic._engine import runtime
    from kinetic._engine.batch_listing import batch_summaries
    from kinetic._settings import load_settings

    settings = load_settings(backend=backend, project=project, cluster=cluster)
    return await batch_summaries(runtime.backend_for_settings(settings).storage)
