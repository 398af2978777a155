"""Kinetic: run a decorated Python function as a durable job and await its handle.

The blocking API lives here; the async originals, with the same names, in
:mod:`kinetic.aio` (and on every decorated function as ``fn.aio``)::

    import kinetic

    @kinetic.run(accelerator="cpu")
    def square(x):
        return x * x

    square(3)                      # 9: runs as a job, blocks for the value
    job = square.run_async(3)      # kinetic.JobHandle
    job.result()                   # 9
"""

from __future__ import annotations

# First: Kinetic's own top-level `runner` package, or a clear error naming the impostor.
from kinetic import _runner_guard  # noqa: F401  # isort: skip
from kinetic import _log, aio
from kinetic._core.retries import Retries
from kinetic._core.secret_spec import Secret
from kinetic._core.status import JobStatus, StatusReport
from kinetic._data.data import Data
from kinetic._exceptions import (
    AcceleratorError,
    BackendError,
    BatchError,
    BlockingCallError,
    ConfigError,
    DataError,
    ImageBuildError,
    InvalidFunctionError,
    JobCancelledError,
    JobError,
    JobFailedError,
    JobNotFoundError,
    JobPreemptedError,
    JobTimeoutError,
    KineticBlockingWarning,
    KineticError,
    ObjectNotFoundError,
    ProfileError,
    RemoteError,
    RequirementsError,
    ResultError,
    RuntimeConflictError,
    SerializationError,
    StorageError,
    UntrustedStorageError,
)
from kinetic._sync.api import RemoteFunction, attach, list_jobs, run
from kinetic._sync.batch import BatchHandle, attach_batch
from kinetic._sync.handle import JobHandle
from kinetic._version import __version__

# Messages are records on the `kinetic` logger; a script that configures no logging
# still sees them on stderr (kinetic/_log.py, docs/logging.md).
_log.install()

__all__ = [
    "AcceleratorError",
    "BackendError",
    "BatchError",
    "BatchHandle",
    "BlockingCallError",
    "ConfigError",
    "Data",
    "DataError",
    "ImageBuildError",
    "InvalidFunctionError",
    "JobCancelledError",
    "JobError",
    "JobFailedError",
    "JobHandle",
    "JobNotFoundError",
    "JobPreemptedError",
    "JobStatus",
    "JobTimeoutError",
    "KineticBlockingWarning",
    "KineticError",
    "ObjectNotFoundError",
    "ProfileError",
    "RemoteError",
    "RemoteFunction",
    "RequirementsError",
    "ResultError",
    "Retries",
    "RuntimeConflictError",
    "Secret",
    "SerializationError",
    "StatusReport",
    "StorageError",
    "UntrustedStorageError",
    "__version__",
    "aio",
    "attach",
    "attach_batch",
    "list_jobs",
    "run",
]
