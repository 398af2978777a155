"""``kinetic``: the command line. One module per command group.

    kinetic jobs ...          look after single jobs (:mod:`kinetic._cli.jobs`)
    kinetic batch ...         look after batches (:mod:`kinetic._cli.jobs`)
    kinetic accelerators ...  the accelerator catalog (:mod:`kinetic._cli.accelerators`)
    kinetic config show       settings and their sources (:mod:`kinetic._cli.config`)
    kinetic profile ...       named settings (:mod:`kinetic._cli.profile`)
    kinetic doctor            check this machine and the cluster (:mod:`kinetic._cli.doctor`)
    kinetic build-image ...   build and push the prebuilt base images
                              (:mod:`kinetic._cli.build_image`)
    kinetic context [PATH]    what travels with a job, and its size
                              (:mod:`kinetic._cli.context`)
    kinetic dashboard         jobs and batches in a browser (:mod:`kinetic._cli.dashboard`)
    kinetic init              first set-up: join a cluster, create one, or go local
                              (:mod:`kinetic._cli.init`)
    kinetic completion SHELL  a bash, zsh or fish completion script
                              (:mod:`kinetic._cli.completion`)
    kinetic up | down | status | pool ...
                              set up (and take down) a cluster for Kinetic
                              (:mod:`kinetic._cli.infra`)

Settings (backend, project, zone, cluster, namespace) resolve as for ``kinetic.run``:
the options before the command group, then ``KINETIC_*`` variables, then the active
profile, then the defaults. Exit statuses are listed in :mod:`kinetic._cli._output`
(0 ok, 1 failed, 2 usage, 3 not found, 4 timeout, 130 interrupted).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from kinetic._cli import (
    accelerators,
    build_image,
    completion,
    config,
    context,
    dashboard,
    doctor,
    infra,
    init,
    jobs,
    profile,
)
from kinetic._cli._output import EXIT_FAILED, EXIT_INTERRUPTED
from kinetic._version import __version__

_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "jobs": jobs.run,
    "batch": jobs.run,
    "accelerators": accelerators.run,
    "config": config.run,
    "profile": profile.run,
    "doctor": doctor.run,
    "build-image": build_image.run,
    "context": context.run,
    "dashboard": dashboard.run,
    "init": init.run,
    "completion": completion.run,
    "up": infra.run,
    "down": infra.run,
    "status": infra.run,
    "pool": infra.run,
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kinetic",
        description="Run and look after Kinetic jobs. See docs/cli.md.",
        epilog="exit status: 0 ok, 1 failed, 2 usage, 3 not found, 4 timeout, 130 interrupted",
    )
    parser.add_argument("--version", action="version", version=f"kinetic {__version__}")
    parser.add_argument("--backend", help="local, gke or pathways")
    parser.add_argument("--project", help="GCP project")
    parser.add_argument("--zone", help="GCP zone")
    parser.add_argument("--cluster", help="cluster name")
    parser.add_argument("--namespace", help="Kubernetes namespace")
    sub = parser.add_subparsers(dest="group", required=True, metavar="COMMAND")
    init.add_parser(sub)
    jobs.add_parsers(sub)
    accelerators.add_parser(sub)
    config.add_parser(sub)
    profile.add_parser(sub)
    doctor.add_parser(sub)
    build_image.add_parser(sub)
    context.add_parser(sub)
    dashboard.add_parser(sub)
    infra.add_parsers(sub)
    completion.add_parser(sub, parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status (bad usage exits 2 from argparse)."""
    ns = _parser().parse_args(argv)
    try:
        return _COMMANDS[ns.group](ns)
    except KeyboardInterrupt:
        print("kinetic: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader (`| head`) left: say nothing more, and let the interpreter's final
        # flush of stdout go nowhere instead of raising again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
