"""``kinetic jobs`` and ``kinetic batch``: look after jobs and batches from a shell.

kinetic jobs list                 newest first
kinetic jobs status JOB_ID        status, with the reason when it failed
kinetic jobs logs JOB_ID [-f]     output so far (-f: follow until the job ends)
kinetic jobs result JOB_ID        the value (repr), or the job's error
kinetic jobs cancel JOB_ID
kinetic jobs cleanup JOB_ID
kinetic batch status GROUP_ID     counts per status
kinetic batch cancel GROUP_ID
"""

from __future__ import annotations

import argparse
import sys

from kinetic._exceptions import KineticError


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``jobs`` and ``batch`` command groups."""
    jobs = sub.add_parser("jobs", help="single jobs").add_subparsers(dest="action", required=True)
    jobs.add_parser("list", help="list recorded jobs")
    for action in ("status", "result", "cancel", "cleanup"):
        jobs.add_parser(action).add_argument("job_id")
    logs = jobs.add_parser("logs")
    logs.add_argument("job_id")
    logs.add_argument("-f", "--follow", action="store_true")
    batch = sub.add_parser("batch", help="batches").add_subparsers(dest="action", required=True)
    for action in ("status", "cancel"):
        batch.add_parser(action).add_argument("group_id")


def run(ns: argparse.Namespace) -> int:
    """Run a ``jobs`` or ``batch`` command; return the exit status."""
    import kinetic

    where = {"project": ns.project, "cluster": ns.cluster, "backend": ns.backend}
    try:
        if ns.group == "batch":
            batch = kinetic.attach_batch(ns.group_id, **where)
            if ns.action == "cancel":
                batch.cancel()
            for status, count in sorted(batch.status_counts().items()):
                print(f"{status:10} {count}")
            return 0
        if ns.action == "list":
            for job in kinetic.list_jobs(
                project=ns.project, cluster=ns.cluster, backend=ns.backend
            ):
                print(f"{job.job_id}  {job.created_at}  {job.func_name}  {job.status().value}")
            return 0
        job = kinetic.attach(ns.job_id, **where)
        if ns.action == "status":
            report = job.status_report()
            detail = f"  ({report.reason})" if report.reason else ""
            print(f"{report.status.value}{detail}")
            return 1 if report.status is kinetic.JobStatus.FAILED else 0
        if ns.action == "logs":
            text = job.logs(follow=ns.follow)
            if text is not None:
                sys.stdout.write(text)
            return 0
        if ns.action == "result":
            print(repr(job.result(cleanup=False)))
            return 0
        if ns.action == "cancel":
            job.cancel()
            return 0
        job.cleanup()
        return 0
    except KineticError as exc:
        print(f"kinetic: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - the job's own error, reported not raised
        print(f"kinetic: the job raised {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
