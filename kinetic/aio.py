"""The async API: the originals that the blocking ``kinetic`` API wraps.

Same names and parameters as ``kinetic``; every call that waits is a coroutine::

    from kinetic import aio

    @aio.run(accelerator="cpu")
    def square(x):
        return x * x

    job = await square.run_async(3)
    assert await job.result() == 9
"""

from __future__ import annotations

from kinetic._core.retries import Retries
from kinetic._core.secret_spec import Secret
from kinetic._core.status import JobStatus, StatusReport
from kinetic._data.data import Data
from kinetic._engine.batch import BatchHandle
from kinetic._engine.batch_submit import attach_batch
from kinetic._engine.handle import JobHandle
from kinetic._engine.remote import AsyncRemoteFunction as RemoteFunction
from kinetic._engine.remote import attach, list_jobs, run

__all__ = [
    "BatchHandle",
    "Data",
    "JobHandle",
    "JobStatus",
    "RemoteFunction",
    "Retries",
    "Secret",
    "StatusReport",
    "attach",
    "attach_batch",
    "list_jobs",
    "run",
]
