"""``kinetic``: the command line. One module per command group.

    kinetic jobs ...          look after single jobs (:mod:`kinetic._cli.jobs`)
    kinetic batch ...         look after batches (:mod:`kinetic._cli.jobs`)
    kinetic build-image ...   build and push the prebuilt base images
                              (:mod:`kinetic._cli.build_image`)
    kinetic context [PATH]    what travels with a job, and its size
                              (:mod:`kinetic._cli.context`)

Settings (backend, project, cluster) resolve as for ``kinetic.run``: options, then
``KINETIC_*`` variables, then the active profile. Exit status: 0 on success, 1 when
the job failed or an error occurred, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kinetic._cli import build_image, context, jobs


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kinetic", description="Manage Kinetic jobs.")
    parser.add_argument("--backend", help="local, gke or pathways")
    parser.add_argument("--project")
    parser.add_argument("--cluster")
    sub = parser.add_subparsers(dest="group", required=True)
    jobs.add_parsers(sub)
    build_image.add_parser(sub)
    context.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    ns = _parser().parse_args(argv)
    if ns.group == "build-image":
        return build_image.run(ns)
    if ns.group == "context":
        return context.run(ns)
    return jobs.run(ns)


if __name__ == "__main__":
    sys.exit(main())
