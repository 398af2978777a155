"""``kinetic jobs debug JOB_ID``: attach a debugger to a running ``debug=True`` job.

    kinetic jobs debug JOB_ID [--port 5678] [--working-dir DIR] [--timeout 600] [--json]

What ``job.debug_attach()`` does (:mod:`kinetic._debug.attach`), from a shell: wait
until the job's debugpy listens, forward ``127.0.0.1:PORT`` to it (on GKE through the
Kubernetes API's port-forward to the job's pod), print the VS Code launch
configuration and the address to point the debugger at, then hold the forward until
the job ends or Ctrl-C. Ending the forward never ends the job.

Exit status: 0 the job ended (whatever its status: the debugging session is what
ended), 1 the job failed before its debugger was ready or the forward failed, 2 not a
debug job (or a batch input, or one that has ended; or the port is taken), 3 no such
job, 4 the debugger was not ready within ``--timeout``, 130 Ctrl-C (the job keeps
running).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
from typing import TYPE_CHECKING

from kinetic._cli._output import EXIT_FAILED, EXIT_OK, emit_json

if TYPE_CHECKING:
    from kinetic._sync.handle import JobHandle

DEFAULT_PORT = 5678
POLL = 1.0
"""Seconds between two reads of the job's status while the forward is held."""


def add_parser(jobs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``jobs debug``."""
    p = jobs.add_parser(
        "debug",
        help="attach a debugger to a running debug job (held until it ends or Ctrl-C)",
        description=(
            "Forward 127.0.0.1:PORT to a debug=True job's debugger, print where to point "
            "the debugger, and hold the forward until the job ends or Ctrl-C."
        ),
    )
    p.add_argument("job_id")
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"the local port (default: {DEFAULT_PORT}; 0 picks a free one)",
    )
    p.add_argument(
        "--working-dir",
        help="your copy of the project: the launch configuration's localRoot",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds to wait for the job's debugger to be ready (default: 600; exit 4)",
    )
    p.add_argument("--json", action="store_true", help="the forward as one JSON object")


def run(ns: argparse.Namespace, job: JobHandle) -> int:
    """Attach, hold the forward until the job ends (or Ctrl-C), close it.

    :raises KineticError: as ``JobHandle.debug_attach`` (the caller reports it).
    """
    if ns.json:
        told = io.StringIO()  # the human announcement; the JSON object says the same
        with contextlib.redirect_stdout(told):
            forward = job.debug_attach(ns.port, ns.working_dir, timeout=ns.timeout)
    else:
        forward = job.debug_attach(ns.port, ns.working_dir, timeout=ns.timeout)
    try:
        address = f"127.0.0.1:{forward.local_port}"
        if ns.json:
            emit_json(
                {
                    "job_id": forward.job_id,
                    "address": address,
                    "host": "127.0.0.1",
                    "port": forward.local_port,
                    "target": forward.target,
                    "launch_config": forward.launch_config,
                }
            )
        else:
            print(f"address: {address}")
        sys.stdout.flush()
        print(
            f"kinetic: point the debugger at {address}; the forward is held until job "
            f"{forward.job_id} ends (Ctrl-C ends it sooner; the job keeps running)",
            file=sys.stderr,
            flush=True,
        )
        while True:
            status = job.status()
            if status.is_terminal:
                print(f"kinetic: job {forward.job_id} ended: {status.value}", file=sys.stderr)
                return EXIT_OK
            if forward.closed:
                print("kinetic: the debug forward stopped", file=sys.stderr)
                for error in forward.errors:
                    print(f"kinetic: {error}", file=sys.stderr)
                return EXIT_FAILED
            time.sleep(POLL)
    finally:
        forward.close()
