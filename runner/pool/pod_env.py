"""What a pool worker's pod is told by its Job (``kinetic/_core/k8s_spec.py``'s
``pool_job_manifest``): its completion index, and the pool's size.
"""

from __future__ import annotations

import os


def worker_ordinal() -> int | None:
    """This pod's completion index in an Indexed Job (``KINETIC_WORKER_INDEX``, from the
    pod's ``batch.kubernetes.io/job-completion-index`` annotation), or None: a cluster
    without Indexed Jobs (before Kubernetes 1.21) leaves the annotation out, and the
    worker then starts in a region of its own choosing."""
    value = os.environ.get("KINETIC_WORKER_INDEX", "")
    return int(value) if value.isdigit() else None


POOL_WORKERS_ENV = "KINETIC_POOL_WORKERS"


def pool_workers() -> int | None:
    """The pool's size as the Job tells its pods (``KINETIC_POOL_WORKERS``), or None
    (a Job written before it was set): then the worker spreads its start after reading
    the manifest, which names the size too."""
    value = os.environ.get(POOL_WORKERS_ENV, "")
    return int(value) if value.isdigit() and int(value) > 0 else None
