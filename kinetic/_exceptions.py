"""Kinetic's exception tree.

Every error Kinetic raises on its own behalf derives from :class:`KineticError`.
Errors of the user's function are not wrapped: they are re-raised as their
original type with the remote traceback attached as a note. Errors of
foreign libraries (aiohttp, gcloud-aio-storage, OS errors at the IO
edges) are translated into this tree where they happen, with the original
exception chained as ``__cause__``.

Where a Kinetic error also means what a builtin means (an invalid argument,
a timeout), it inherits the builtin too, so ``except ValueError`` keeps working::

    KineticError
    ├── ConfigError (ValueError)          bad options, unknown backend, bad mount path
    │   ├── ProfileError                  malformed ~/.kinetic/profiles.json
    │   ├── AcceleratorError              unparseable or unservable accelerator
    │   ├── DataError                     bad ``Data`` argument
    │   └── RequirementsError             a dependency line that cannot be used
    │       └── RuntimeConflictError      no installable set for the image's platform
    ├── InvalidFunctionError (TypeError)  the decorated object cannot run as a job
    ├── SerializationError                function or argument cannot be pickled
    ├── JobNotFoundError (LookupError, RuntimeError)  no such job / batch
    ├── JobError                          a job ended without a value
    │   ├── JobFailedError (RuntimeError) runner failed or vanished, SystemExit, ...
    │   │   └── JobPreemptedError         its pod was lost (preempted, evicted), no retry left
    │   ├── ResultError (RuntimeError)    result payload missing or corrupted
    │   ├── JobCancelledError (RuntimeError)  the job was cancelled
    │   └── RemoteError                   user exception whose type could not be rebuilt
    ├── BatchError                        some inputs of a batch failed
    ├── JobTimeoutError (TimeoutError)    waiting exceeded the caller's timeout
    ├── StorageError                      object storage failed
    │   └── ObjectNotFoundError (LookupError)
    ├── UntrustedStorageError (PermissionError)  a handle names storage this process
    │                                     does not trust (another user's, or any bucket
    │                                     but the configured one)
    ├── BackendError                      the execution backend failed
    │   └── ImageBuildError               an image could not be built or pushed
    └── BlockingCallError (RuntimeError)  sync API called from Kinetic's own loop thread

    KineticBlockingWarning (RuntimeWarning)   sync API called while the caller's loop runs
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "AcceleratorError",
    "BackendError",
    "BatchError",
    "BlockingCallError",
    "ConfigError",
    "DataError",
    "ImageBuildError",
    "InvalidFunctionError",
    "JobCancelledError",
    "JobError",
    "JobFailedError",
    "JobNotFoundError",
    "JobPreemptedError",
    "JobTimeoutError",
    "KineticBlockingWarning",
    "KineticError",
    "ObjectNotFoundError",
    "ProfileError",
    "RemoteError",
    "RequirementsError",
    "ResultError",
    "RuntimeConflictError",
    "SerializationError",
    "StorageError",
    "UntrustedStorageError",
]


class KineticError(Exception):
    """Base class of every error Kinetic raises on its own behalf."""


class ConfigError(KineticError, ValueError):
    """An option, setting or argument is invalid. Raised before anything is submitted."""


class ProfileError(ConfigError):
    """The profiles file cannot be read or is malformed. The message names the file."""


class AcceleratorError(ConfigError):
    """The accelerator name cannot be parsed, or the chosen backend cannot serve it."""


class DataError(ConfigError):
    """A ``Data`` argument or volume is invalid."""


class RequirementsError(ConfigError):
    """A line of the project's ``requirements.txt`` / ``pyproject.toml`` dependencies
    cannot be parsed, or cannot be installed where the job runs. The message names the
    file and the line."""


class RuntimeConflictError(RequirementsError):
    """The project's requirements, with the accelerator runtime its image carries (JAX
    for the job's platform, Keras), have no installable set for the image's platform
    (Linux x86-64, the image's Python). Raised at submission, before anything is built
    or uploaded; the message names the line(s), the platform and the resolver's reason."""


class InvalidFunctionError(KineticError, TypeError):
    """The decorated object cannot be run as a job (not callable, a classmethod, ...)."""


class SerializationError(KineticError):
    """The function, an argument or a result cannot be pickled or unpickled."""


class JobNotFoundError(KineticError, LookupError, RuntimeError):
    """No job (or batch) with this id exists in the configured storage.

    Also a ``RuntimeError``: a result read after the job was cleaned up ends without a
    value, and the original's ``except RuntimeError:`` catches every such job.
    """


class JobError(KineticError):
    """A job ended without producing a value.

    :ivar job_id: the job's id.
    :ivar phase: the runner phase that failed (``"fetch"``, ``"unpack"``, ``"deserialize"``,
        ``"execute"``, ``"serialize"``, ``"upload"``), or ``None`` when unknown.
    """

    def __init__(self, message: str, *, job_id: str | None = None, phase: str | None = None):
        super().__init__(message)
        self.job_id = job_id
        self.phase = phase


class JobFailedError(JobError, RuntimeError):
    """The job failed outside the user's code, or ended via ``SystemExit``/a signal.

    Also a ``RuntimeError``: the original documents ``result()`` raising one when the job
    fails, and ``except RuntimeError:`` written for it keeps working.
    """


class JobPreemptedError(JobFailedError):
    """The job's pod was lost while its function ran (preempted, evicted, its node gone)
    and its ``retries`` allowed no other attempt. Its ``phase`` is ``"preempted"``.

    Such a loss is retried whatever ``Retries.on`` names: it is no exception of the
    function. Running it again (or with ``retries=``) may well succeed.
    """


class ResultError(JobError, RuntimeError):
    """The job's result payload is missing, corrupted or cannot be loaded here.

    Also a ``RuntimeError``, as the original documents for a job that leaves no result.
    """


class JobCancelledError(JobError, RuntimeError):
    """The job was cancelled before it produced a value.

    Also a ``RuntimeError``, as every job that ended without a value is in the original.
    """


class RemoteError(JobError):
    """The user's function raised an exception that could not be rebuilt locally.

    :ivar remote_type: the qualified name of the remote exception's type.
    """

    def __init__(self, message: str, *, remote_type: str, job_id: str | None = None):
        super().__init__(message, job_id=job_id, phase="execute")
        self.remote_type = remote_type


class BatchError(KineticError):
    """Some inputs of a batch failed (raised by ``BatchHandle.results()``).

    :ivar group_id: the batch's id.
    :ivar failures: the handles of the inputs that failed or were cancelled.
    :ivar partial_results: one entry per input (in the order results were asked for):
        the value where the input succeeded, ``None`` where it failed.
    :ivar submission_failures: input index -> the error that kept it from being submitted.
    """

    def __init__(
        self,
        group_id: str,
        failures: Sequence[Any],
        partial_results: Sequence[Any],
        submission_failures: Mapping[int, BaseException] | None = None,
    ):
        self.group_id = group_id
        self.failures = list(failures)
        self.partial_results = list(partial_results)
        self.submission_failures = dict(submission_failures or {})
        n_bad = len(self.failures) + len(self.submission_failures)
        super().__init__(f"batch {group_id}: {n_bad} of {len(self.partial_results)} inputs failed")

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (self.group_id, self.failures, self.partial_results, self.submission_failures),
        )


class JobTimeoutError(KineticError, TimeoutError):
    """Waiting for a job exceeded the caller's timeout. The job keeps running."""


class StorageError(KineticError):
    """An object storage operation failed.

    :ivar transient: the failure may pass (storage unreachable, overloaded, answering
        5xx or 429 after the client's own retries): trying again later may succeed.
    """

    def __init__(self, *args: object, transient: bool = False) -> None:
        super().__init__(*args)
        self.transient = transient


class ObjectNotFoundError(StorageError, LookupError):
    """The requested object does not exist.

    :ivar key: the missing object's key.
    """

    def __init__(self, key: str, location: str = ""):
        super().__init__(f"object not found: {location}{key}")
        self.key = key


class UntrustedStorageError(KineticError, PermissionError):
    """A handle names storage this process does not read from: a local root another
    user could write, or a bucket other than the configured one. Its job's payload and
    result would be unpickled, which runs code: nothing of it was read. Trust it
    explicitly with ``JobHandle.from_dict(d, trust_storage=True)``."""


class BackendError(KineticError):
    """The execution backend (process launcher, Kubernetes API, ...) failed."""


class ImageBuildError(BackendError):
    """A container image could not be built or pushed (the message ends with the
    failing step's log tail). No tag is left behind that a later run would trust."""


class BlockingCallError(KineticError, RuntimeError):
    """A blocking (sync) Kinetic call was made from Kinetic's own event loop thread.

    It would deadlock; use the ``kinetic.aio`` twin with ``await`` instead.
    """


class KineticBlockingWarning(RuntimeWarning):
    """A blocking Kinetic call was made from a thread that runs an event loop.

    It works (the job runs on Kinetic's own loop thread) but stalls the caller's loop.
    """


def format_choices(choices: Sequence[str]) -> str:
    """Join valid choices for an error message."""
    return ", ".join(repr(c) for c in choices)
