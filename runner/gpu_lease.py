"""GPU leases of local jobs: a job holds its GPUs itself, for exactly as long as it lives.

Theory of operation
-------------------
The local backend tells a GPU job what it needs in ``KINETIC_GPU_REQUEST`` (JSON: how
many GPUs, the ids of the machine's GPUs, and a directory of lock files). Each GPU id
has a lock file ``{dir}/{id}.lock``; a job holds a GPU by holding an exclusive
``flock`` on its file. The lock belongs to the job's own process (and to children it
forks), so the kernel drops it when the job ends, however it ends: exit, crash,
``kill -9``, cancel. No grant can outlive its job, and nothing has to clean up.

Choosing happens under a short exclusive ``flock`` on ``{dir}/choose.lock``: a chooser
probes every GPU's lock without blocking, keeps the ones :func:`choose` picks and lets
the others go at once. A job therefore takes all its GPUs or none — two jobs never
each hold half of what both need (no deadlock), and no GPU is ever granted twice.

A job that finds too few free GPUs waits: it probes again after a short sleep. (flock
cannot wait for "any one of these files", and a blocking lock on one file would hold
a GPU outside the choose lock.) The sleep grows to :data:`WAIT_CAP` seconds.

:func:`choose` is the pure part (no IO), unit-tested on its own; the rest is the
kernel's bookkeeping. ``runner`` never imports ``kinetic``: this module stands alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Callable, Collection, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any, Self

from runner.store import RunnerStore

__all__ = [
    "REQUEST_ENV",
    "WAIT_CAP",
    "GpuLease",
    "GpuRequest",
    "acquire",
    "choose",
    "group_wait_key",
    "hold_for_job",
    "job_gpus_key",
    "try_acquire",
    "visible_devices",
]

REQUEST_ENV = "KINETIC_GPU_REQUEST"
"""The variable that carries a job's :class:`GpuRequest` (absent: the job needs no GPU)."""

WAIT_CAP = 0.5
"""Longest sleep, in seconds, between two looks of a job that waits for GPUs."""

_CHOOSE_LOCK = "choose.lock"


def job_gpus_key(job_id: str) -> str:
    """The record of a single job's GPUs: ``{"state": "waiting"|"granted", ...}``."""
    return f"{job_id}/gpus.json"


def group_wait_key(group_id: str) -> str:
    """Present while a batch's supervisor has no worker because every GPU is taken."""
    return f"_groups/{group_id}/gpu_wait.json"


# ------------------------------------------------------------------------------ pure


def choose(ids: Sequence[str], busy: Collection[str], count: int) -> tuple[str, ...] | None:
    """The GPUs to grant: the first ``count`` of ``ids`` not in ``busy``, in ``ids`` order.

    None means "wait": fewer than ``count`` are free. A grant is all or nothing, and
    never includes a busy id. Pure.

    :raises ValueError: when ``count`` is not between 1 and ``len(ids)`` (the request
        could never be granted: waiting would be forever).
    """
    if not 1 <= count <= len(ids):
        raise ValueError(f"cannot grant {count} GPU(s) out of {len(ids)}: {list(ids)}")
    free = [gpu for gpu in ids if gpu not in busy]
    if len(free) < count:
        return None
    return tuple(free[:count])


def visible_devices(ids: Sequence[str]) -> dict[str, str]:
    """The variables that show a process exactly the GPUs ``ids`` (NVML indices).

    CUDA numbers devices fastest-first by default, NVML by PCI bus: asking CUDA for the
    bus order makes the ids mean the same GPUs to both.
    """
    return {"CUDA_VISIBLE_DEVICES": ",".join(ids), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


class GpuRequest:
    """``count`` GPUs out of the machine's ``ids``, coordinated through ``lock_dir``.

    (A plain class: a dataclass would cost the runner ~2 ms of start-up.)

    :raises ValueError: on construction, when ``count`` is not between 1 and ``len(ids)``.
    """

    __slots__ = ("count", "ids", "lock_dir")

    def __init__(self, count: int, ids: tuple[str, ...], lock_dir: str) -> None:
        if not 1 <= count <= len(ids):
            raise ValueError(f"cannot grant {count} GPU(s) out of {list(ids)}")
        self.count, self.ids, self.lock_dir = count, tuple(ids), lock_dir

    def __repr__(self) -> str:
        return f"GpuRequest({self.count}, {self.ids!r}, {self.lock_dir!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GpuRequest):
            return NotImplemented
        return (self.count, self.ids, self.lock_dir) == (other.count, other.ids, other.lock_dir)

    def __hash__(self) -> int:
        return hash((self.count, self.ids, self.lock_dir))

    @property
    def max_holders(self) -> int:
        """How many jobs of this size the machine can run at once."""
        return len(self.ids) // self.count

    def to_env(self) -> str:
        """The value of :data:`REQUEST_ENV` that :meth:`from_env` reads back."""
        return json.dumps({"count": self.count, "ids": list(self.ids), "dir": self.lock_dir})

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> GpuRequest | None:
        """The request in ``environ``; None when there is none.

        :raises ValueError: when the variable is malformed.
        """
        raw = environ.get(REQUEST_ENV)
        if not raw:
            return None
        try:
            doc: Any = json.loads(raw)
            return cls(int(doc["count"]), tuple(str(i) for i in doc["ids"]), str(doc["dir"]))
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"malformed {REQUEST_ENV}: {raw!r}") from exc


# -------------------------------------------------------------------------------- IO


class GpuLease:
    """GPUs held by this process: one locked file descriptor per GPU."""

    def __init__(self, ids: tuple[str, ...], fds: list[int]) -> None:
        self.ids = ids
        self._fds = fds

    def __repr__(self) -> str:
        return f"GpuLease({list(self.ids)})"

    def close(self) -> None:
        """Give the GPUs back (closing is enough: the lock lives in these descriptors).

        After a ``fork`` the child shares the locks: the parent calls this to hand them
        over, and they are released when the child's copies close too. (``LOCK_UN``
        would release them for both, so it is never used.)
        """
        fds, self._fds = self._fds, []
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def try_acquire(request: GpuRequest) -> GpuLease | None:
    """Take ``request.count`` free GPUs now, or none (None). Blocking but brief."""
    lock_dir = Path(request.lock_dir)
    lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    chooser = os.open(lock_dir / _CHOOSE_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(chooser, fcntl.LOCK_EX)
        held: dict[str, int] = {}
        try:
            for gpu in request.ids:
                fd = os.open(lock_dir / f"{gpu}.lock", os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)  # another job holds it
                    continue
                held[gpu] = fd
            busy = [gpu for gpu in request.ids if gpu not in held]
            chosen = choose(request.ids, busy, request.count)
        except BaseException:
            for fd in held.values():
                os.close(fd)
            raise
        keep = set(chosen or ())
        for gpu, fd in held.items():
            if gpu not in keep:
                os.close(fd)  # probed only: free again at once
        if chosen is None:
            return None
        return GpuLease(chosen, [held[gpu] for gpu in chosen])
    finally:
        os.close(chooser)  # releases the choose lock


def acquire(
    request: GpuRequest,
    *,
    on_wait: Callable[[], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> GpuLease:
    """Take ``request.count`` GPUs, waiting as long as it takes for them to be free.

    ``on_wait`` is called once, when the first look finds too few free GPUs. Ending the
    process (a signal) ends the wait; nothing is held then.
    """
    delay = 0.02
    waited = False
    while True:
        lease = try_acquire(request)
        if lease is not None:
            return lease
        if not waited and on_wait is not None:
            on_wait()
        waited = True
        sleep(delay)
        delay = min(delay * 2, WAIT_CAP)


def hold_for_job(
    store: RunnerStore, job_id: str, environ: MutableMapping[str, str] | None = None
) -> GpuLease | None:
    """Take the GPUs a local job asked for (waiting for them), and show it only those.

    Reads and removes :data:`REQUEST_ENV` from ``environ`` (default ``os.environ``);
    None when the job asked for no GPU. While it waits, the job's GPU record says
    so (the local backend reports it as PENDING); once granted, it names the GPUs.
    The lease must stay open for the rest of the job's life.

    :raises ValueError: on a malformed request.
    """
    env = os.environ if environ is None else environ
    request = GpuRequest.from_env(env)
    env.pop(REQUEST_ENV, None)  # the job's own jobs must not inherit it
    if request is None:
        return None

    def record(doc: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):  # a record is for people; the lock is the truth
            store.write(job_gpus_key(job_id), json.dumps(doc).encode())

    def waiting() -> None:
        record({"state": "waiting", "count": request.count, "machine": list(request.ids)})
        print(  # into the job's log, for whoever follows it
            f"kinetic runner: waiting for {request.count} GPU(s); other jobs hold the "
            f"machine's GPUs ({', '.join(request.ids)})",
            file=sys.stderr,
            flush=True,
        )

    lease = acquire(request, on_wait=waiting)
    record({"state": "granted", "ids": list(lease.ids)})
    env.update(visible_devices(lease.ids))
    return lease
