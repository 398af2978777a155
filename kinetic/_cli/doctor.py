"""``kinetic doctor``: is this machine (and the cluster it points at) ready for jobs?

    kinetic [--backend B --project P --cluster C --namespace N] doctor [--timeout S] [--json]

Each check ends ``ok``, ``warn`` (works, but something is missing or odd), ``fail``
(jobs will not run) or ``skip`` (not relevant here, or blocked by an earlier
failure), with what it saw and, when not ok, a hint that fixes it. The checks:
Python, Kinetic's packages, the settings, the local root, and, when the backend is
``gke`` or ``pathways``: the kubeconfig and its current context, the cluster's API
server, the namespace, the pods' service account (and, where jobs reach Google
Cloud for real, its Workload Identity binding, the Google service account's access
to the bucket and, with the nodes', to the image repository), the LeaderWorkerSet CRD (needed
by ``pathways`` only: a warning otherwise), the jobs bucket (written, read back and
deleted), the image registry and the image builder (Docker Engine socket or Cloud
Build credentials).

Each check is a small coroutine bounded by ``--timeout`` (default 10 s) in
:mod:`kinetic._cli.doctor_checks`, ending in a
:class:`~kinetic._cli.doctor_result.CheckResult`; this module holds the verdict and
the rendering. Exit status 0 when no check failed (warnings allowed), 1 when one
did, 2 on bad usage.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from kinetic._cli._output import EXIT_FAILED, EXIT_OK, emit_json, table
from kinetic._cli.doctor_result import LEVELS, CheckResult

DEFAULT_TIMEOUT = 10.0


def exit_status(results: Sequence[CheckResult]) -> int:
    """0 when no check failed (warnings and skips allowed), else 1. Pure."""
    return EXIT_FAILED if any(r.level == "fail" for r in results) else EXIT_OK


def summary(results: Sequence[CheckResult]) -> str:
    """One line: how many checks ended at each level. Pure."""
    counts = {level: sum(r.level == level for r in results) for level in LEVELS}
    return ", ".join(f"{n} {level}" for level, n in counts.items() if n)


def document(results: Sequence[CheckResult]) -> dict[str, Any]:
    """The ``--json`` output: ``ok`` (no failure) and every check. Pure."""
    return {"ok": exit_status(results) == EXIT_OK, "checks": [asdict(r) for r in results]}


_STYLES = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``doctor`` command."""
    p = sub.add_parser(
        "doctor",
        help="check this machine and the cluster, with a fix for each problem",
        description="Check Python, packages, settings, cluster, bucket, registry and builder.",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds each check may take (default: {DEFAULT_TIMEOUT:g})",
    )
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")


def run(ns: argparse.Namespace) -> int:
    """Run ``doctor``; return the exit status."""
    import anyio

    from kinetic._cli.doctor_checks import run_checks

    arguments = {
        "backend": ns.backend,
        "project": ns.project,
        "zone": ns.zone,
        "cluster": ns.cluster,
        "namespace": ns.namespace,
    }
    results = anyio.run(run_checks, arguments, ns.timeout)
    if ns.json:
        emit_json(document(results))
    else:
        rows = [[r.name, r.level, r.detail, r.hint] for r in results]
        table(
            ("check", "status", "detail", "fix"),
            rows,
            title="kinetic doctor",
            styles=[_STYLES[r.level] for r in results],
        )
        print(summary(results))
    return exit_status(results)
