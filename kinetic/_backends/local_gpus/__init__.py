"""Accelerators on the user's own machine, for the local backend.

* :mod:`.inventory`: the machine's GPUs (NVML, ``KINETIC_LOCAL_GPUS``), read once per
  process.
* :mod:`.environment`: admitting a job's accelerator (errors, one warning), and the
  environment that makes a local job see what its pod would.

The pure rules are :func:`kinetic._core.accelerators.plan_local` (what a job gets) and
:func:`runner.gpu_lease.choose` (which GPUs); the exclusive grants themselves are
``flock`` leases held by each job's own process (:mod:`runner.gpu_lease`).
"""

from __future__ import annotations

from kinetic._backends.local_gpus.environment import admit, apply_job_env, lock_dir
from kinetic._backends.local_gpus.inventory import (
    GPUS_ENV,
    machine_gpus,
    parse_declared,
    select_gpus,
)

__all__ = [
    "GPUS_ENV",
    "admit",
    "apply_job_env",
    "lock_dir",
    "machine_gpus",
    "parse_declared",
    "select_gpus",
]
