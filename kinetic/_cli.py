"""``kinetic``: look after jobs and batches from a shell.

    kinetic jobs list                 newest first
    kinetic jobs status JOB_ID        status, with the reason when it failed
    kinetic jobs logs JOB_ID [-f]     output so far (-f: follow until the job ends)
    kinetic jobs result JOB_ID        the value (repr), or the job's error
    kinetic jobs cancel JOB_ID
    kinetic jobs cleanup JOB_ID
    kinetic batch status GROUP_ID     counts per status
    kinetic batch cancel GROUP_ID

Settings (backend, project, cluster) resolve as for ``kinetic.run``: options, then
``KINETIC_*`` variables, then the active profile. Exit status: 0 on success, 1 when
the job failed or an error occurred, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kinetic._exceptions import KineticError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kinetic", description="Manage Kinetic jobs.")
    parser.add_argument("--backend", help="local, gke or pathways")
    parser.add_argument("--project")
    parser.add_argument("--cluster")
    sub = parser.add_subparsers(dest="group", required=True)
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    ns = _parser().parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
