"""The namespaces a local job enters at its start, while it still runs one thread.

A local job that asks for volumes (:mod:`runner.mounts`) or a debugger
(:mod:`runner.debug_net`) needs namespaces of its own, and without root the way to them
is a user namespace, which the kernel grants only to a process with one thread. The
job's function is unpickled later, and unpickling imports its module, whose imports
start threads often (``import numpy`` starts its BLAS pool; torch and most ML libraries
do the same). So the runner enters the namespaces here, before the payload is read:

- a debug job (host 0), without root: its debugger thread then makes a network
  namespace of its own there;
- a job with local volumes: its volumes are placed later in a mount namespace of its
  own (after the helper that removes their mount points has started outside it).

A pod needs neither: its network and mounts are its own already. Where the kernel
refuses, the job goes on; what needed the namespace fails later in its own phase,
naming this refusal (:func:`refusal`). Standard library only.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from runner.store import FileStore

if TYPE_CHECKING:
    from runner.protocol import JobSpec
    from runner.store import RunnerStore


def needs_private_network(store: RunnerStore, spec: JobSpec, host: int | None) -> bool:
    """Whether the job's debugger must get a network of its own: a debug job's host 0
    on this machine, whose loopback every local user shares."""
    return isinstance(store, FileStore) and spec.get("debug") is not None and not host


_refusal: str | None = None


def refusal() -> str | None:
    """Why the kernel refused the job its user namespace at its start; None when it
    was not refused (or not asked)."""
    return _refusal


def enter_job_namespaces(store: RunnerStore, spec: JobSpec, host: int | None) -> None:
    """Enter the user namespace the job will need (module docstring), while it has one
    thread. Call it before anything of the job's runs. Never raises: a refusal is
    kept for :func:`refusal`."""
    global _refusal
    if not isinstance(store, FileStore):
        return
    debug = needs_private_network(store, spec, host) and os.geteuid() != 0
    if not (debug or spec.get("private_volumes")):
        return
    from runner.userns import enter_user_namespace

    try:
        enter_user_namespace()
    except OSError as exc:
        _refusal = str(exc)
