"""``kinetic dashboard``: serve the dashboard on 127.0.0.1 and print its URL.

    kinetic dashboard [--port N] [--token TOKEN]

The URL carries a random token (as Jupyter's does): anyone without it gets 403. It
reads where the settings point, as ``kinetic jobs`` does. Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import sys

from kinetic._cli._output import EXIT_INTERRUPTED, report_error
from kinetic._exceptions import KineticError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``dashboard`` command."""
    p = sub.add_parser("dashboard", help="jobs and batches in a browser (127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    p.add_argument("--token", default=None, help="the URL's token (default: a random one)")


def run(ns: argparse.Namespace) -> int:
    """Serve until interrupted; return the exit status."""
    from kinetic import dashboard

    def ready(d: dashboard.Dashboard) -> None:
        print(f"Kinetic dashboard ({d.storage_url}), Ctrl-C stops it:", flush=True)
        print(f"    {d.url}", flush=True)

    try:
        dashboard.run(
            port=ns.port,
            token=ns.token,
            backend=ns.backend,
            project=ns.project,
            zone=ns.zone,
            cluster=ns.cluster,
            namespace=ns.namespace,
            on_ready=ready,
        )
    except KeyboardInterrupt:
        print("kinetic: dashboard stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (KineticError, OSError) as exc:
        if isinstance(exc, KineticError):
            return report_error(exc)
        print(f"kinetic: the dashboard cannot listen: {exc}", file=sys.stderr)
        return 1
    return 0
