"""The local backend: each job is a detached process group running ``runner``.

Theory of operation. Submission stores the job's spec, payload and handle in a
local directory store, then :meth:`LocalBackend.launch` starts
``python -m runner`` (the current interpreter) in a new session through a tiny
shell wrapper (or the root's launcher, :mod:`kinetic._backends.local_launcher`), with
output going to the job's ``logs.txt`` and the runner's exit status to ``exit_code``
(the launcher skips it when the runner left its final record, which wins anyway). The
launch record (pid, start time, process group) lets any process, not only the
submitter, tell whether the job is alive.

Status is derived from records plus liveness (see
:func:`kinetic._core.status.status_from_local_records`): the runner's final
record wins; a process that vanished without one is FAILED, with the signal or
exit status as the reason. Waiting uses a pidfd, not a polling loop.

Contexts: every job and batch supervisor started from this root is told (in
``KINETIC_CONTEXT_CACHE``) to share extracted contexts under ``{root}/contexts``: one
read-only extraction per content address, each job with its own working directory
(:mod:`runner.contexts`).

Batches are run by a batch supervisor (:mod:`runner.batch`), driven through
:attr:`LocalBackend.batch_runner` (:mod:`kinetic._backends.local_batch`), which also
answers for their inputs: the methods here are for single jobs only.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

import runner
from kinetic._backends._process import (
    ProcessRef,
    is_alive,
    signal_group,
    spawn_detached,
    wait_exit,
)
from kinetic._backends.base import JobRef, NewJob, Placement, StatusCallback
from kinetic._backends.local_batch import LocalBatches, LocalBatchRunner
from kinetic._backends.local_launcher import spawn_via_launcher
from kinetic._core.status import (
    JobStatus,
    StatusReport,
    attempts_from_records,
    status_from_local_records,
)
from kinetic._core.store_plugins import RUNNER_ENV
from kinetic._exceptions import ObjectNotFoundError
from kinetic._storage.local import LocalStorage, check_root
from runner import protocol
from runner.contexts import CACHE_ENV
from runner.fs import atomic_write, make_private_dirs
from runner.gpu_lease import job_gpus_key

if TYPE_CHECKING:
    from kinetic._core.config import Settings

_LAUNCH = "launch.json"
_EXIT = "exit_code"
_CANCEL = "cancel.json"
_CANCEL_GRACE = 3.0
# There is no portable "file grew" event: following a log re-reads it at this pace.
_LOG_POLL = 0.1
# Makes our own `runner` importable by jobs even when Kinetic runs from a source tree.
_RUNNER_HOME = os.path.dirname(os.path.dirname(os.path.abspath(runner.__file__)))


def job_environment(context_cache: Path | None = None) -> dict[str, str]:
    """The environment local jobs start with: ours, unbuffered, with ``runner`` importable
    and told where its ``gs://`` store is (:mod:`kinetic._core.store_plugins`).

    :param context_cache: where jobs share extracted contexts (:mod:`runner.contexts`).
    """
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"  # so followed logs arrive as they are printed
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), _RUNNER_HOME) if p)
    env.update(RUNNER_ENV)  # its gs:// store, for data on GCS
    if context_cache is not None:
        env[CACHE_ENV] = str(context_cache)
    return env


class LocalBackend:
    """Runs jobs as local processes; storage is a directory.

    :param root: the local root (``KINETIC_LOCAL_ROOT``); objects live in ``root/storage``.
    """

    name = "local"
    ended_jobs_hold_resources = False

    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()
        self.storage = LocalStorage(self.root / "storage")
        # Extracted contexts, shared read-only by the jobs (and batches) of this root.
        self.contexts = self.root / "contexts"
        self.batches = LocalBatches(self.storage, job_environment(self.contexts))
        self.batch_runner = LocalBatchRunner(self.batches)

    def __repr__(self) -> str:
        return f"LocalBackend({str(self.root)!r})"

    # -- submission -------------------------------------------------------------------

    def placement(self, settings: Settings) -> Placement:
        """Storage and outputs under the root; jobs run here, a batch's inputs on as many
        workers as this machine has CPUs."""
        return Placement(
            bucket_name=str(self.storage.root),
            cluster_name="local",
            zone="",
            outputs=str(self.root / "outputs"),
            images=None,
            batch_concurrency=os.cpu_count() or 1,
        )

    async def get_ready(self) -> None:
        """Nothing to check: the root was checked when the settings were read."""

    def prepare_launch(self, job: NewJob) -> _LocalLaunch:
        return _LocalLaunch(self)

    def _key(self, job: JobRef, name: str) -> str:
        return f"{job.job_id}/{name}"

    async def launch(self, job: JobRef) -> None:
        """Start the (stored) job's runner process."""
        job_dir = self.storage.path_for(job.job_id)  # a name only; created in the thread below
        argv = [
            sys.executable,
            "-m",
            "runner",
            "--storage",
            self.storage.url,
            "--job-id",
            job.job_id,
        ]
        env = job_environment(self.contexts)
        from kinetic._backends.local_gpus import apply_job_env  # (kept out of `import kinetic`)

        # The pod's environment: JAX_PLATFORMS, no GPU for a CPU job, a lease request for a
        # GPU job (its runner waits for its GPUs and holds them until it exits).
        apply_job_env(env, getattr(job, "accelerator", "") or "cpu", self.root)

        def _spawn() -> None:
            check_root(self.root)
            make_private_dirs(job_dir)
            _check_free_space(job_dir)
            log_file = self.storage.path_for(protocol.logs_key(job.job_id))
            status_file = self.storage.path_for(self._key(job, _EXIT))
            # cwd: not the user's; a local `runner` package must not shadow ours. The root's
            # warm launcher forks the job; a new interpreter starts it when it cannot.
            ref = spawn_via_launcher(
                argv,
                root=self.root,
                log_file=log_file,
                status_file=status_file,
                final_file=self.storage.path_for(protocol.final_key(job.job_id)),
                cwd=job_dir,
                env=env,
            ) or spawn_detached(
                argv, log_file=log_file, status_file=status_file, cwd=job_dir, env=env
            )
            launch = self.storage.path_for(self._key(job, _LAUNCH))
            atomic_write(launch, protocol.dump_json(ref.to_dict()))

        await self.storage.run_io(_spawn)

    def _read_record(self, key: str) -> Any:
        """A JSON record, or None when absent or being written right now. Blocking."""
        try:
            return protocol.load_json(self.storage.path_for(key).read_bytes())
        except (FileNotFoundError, ValueError):
            return None

    def _launched(self, job: JobRef) -> ProcessRef | None:
        """The job's process as its launch record names it, or None. Blocking."""
        launch = self._read_record(self._key(job, _LAUNCH))
        return None if launch is None else ProcessRef.from_dict(launch)

    def _observe(self, job: JobRef) -> tuple[StatusReport, ProcessRef | None]:
        """The job's status from its records and its process, and that process: one
        blocking pass over the job's files (one worker-thread call per look)."""
        final = self._read_record(protocol.final_key(job.job_id))
        if final is not None:
            report = status_from_local_records(
                final=final, cancelled=False, launched=True, alive=False, exit_code=None
            )
            return report, None
        ref = self._launched(job)
        alive = ref is not None and is_alive(ref)
        exit_code = None
        if ref is not None and not alive:
            # The runner writes its final record before exiting: look again.
            final = self._read_record(protocol.final_key(job.job_id))
            raw = self._read_record(self._key(job, _EXIT))
            exit_code = raw if isinstance(raw, int) else None
        path_for = self.storage.path_for
        if ref is None and not path_for(protocol.handle_key(job.job_id)).is_file():
            return StatusReport(JobStatus.NOT_FOUND, reason="no records for this job"), None
        report = status_from_local_records(
            final=final,
            cancelled=path_for(self._key(job, _CANCEL)).is_file(),
            launched=ref is not None,
            alive=alive,
            exit_code=exit_code,
        )
        if report.status is JobStatus.RUNNING:
            gpus = self._read_record(job_gpus_key(job.job_id))
            if isinstance(gpus, dict) and gpus.get("state") == "waiting":
                report = StatusReport(JobStatus.PENDING, reason=_gpu_wait_reason(gpus))
            attempts = attempts_from_records(self._read_record(protocol.attempts_key(job.job_id)))
            if attempts:  # a job that retries, past its first attempt
                report = replace(report, attempt=len(attempts) + 1, attempts=attempts)
        return report, ref

    async def status(self, job: JobRef) -> StatusReport:
        report, _ = await self.storage.run_io(self._observe, job)
        return report

    async def wait(self, job: JobRef, on_change: StatusCallback | None = None) -> StatusReport:
        last = None
        while True:
            report, ref = await self.storage.run_io(self._observe, job)
            if on_change is not None and report.status != last:
                await on_change(report)
            last = report.status
            if report.status.is_terminal:
                return report
            if ref is None:
                # Recorded but not launched yet (another process is launching it).
                await anyio.sleep(_LOG_POLL)
            else:
                await wait_exit(ref)

    async def logs(self, job: JobRef, *, tail: int | None = None) -> str:
        try:
            data = await self.storage.read(protocol.logs_key(job.job_id))
        except ObjectNotFoundError:
            return ""
        text = data.decode(errors="replace")
        if tail is not None:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-tail:]) if tail > 0 else ""
        return text

    async def follow_logs(
        self, job: JobRef, finished: anyio.Event | None = None
    ) -> AsyncIterator[str]:
        path = self.storage.path_for(protocol.logs_key(job.job_id))
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        offset = 0
        while True:
            # Decide "over" before reading, so output written just before the end is kept.
            over = (finished is not None and finished.is_set()) or (
                await self.status(job)
            ).status.is_terminal
            chunk = await anyio.to_thread.run_sync(_read_from, path, offset)
            if chunk:
                offset += len(chunk)
                yield decoder.decode(chunk)
                continue
            if over:
                tail = decoder.decode(b"", final=True)
                if tail:
                    yield tail
                return
            with anyio.move_on_after(_LOG_POLL):  # or as soon as the caller saw the end
                if finished is not None:
                    await finished.wait()
                else:
                    await anyio.sleep(_LOG_POLL)

    async def cancel(self, job: JobRef) -> None:
        if await self.storage.exists(protocol.final_key(job.job_id)):
            return  # already over: nothing to cancel, and its record must stay truthful
        await self.storage.write(self._key(job, _CANCEL), protocol.dump_json({"cancelled": True}))
        ref = await self.storage.run_io(self._launched, job)
        if ref is None:
            return
        signal_group(ref, signal.SIGTERM)
        with anyio.move_on_after(_CANCEL_GRACE):
            await wait_exit(ref)
            await self.storage.run_io(self._end_debug_helpers, job)
            return
        signal_group(ref, signal.SIGKILL)
        await wait_exit(ref)
        await self.storage.run_io(self._end_debug_helpers, job)

    def _end_debug_helpers(self, job: JobRef) -> None:
        """End what a debug job's debugger left running (its adapter daemonizes, so the
        job's group did not hold it; the ready marker names it). Blocking."""
        from runner.debug import ready_key  # (cancel only: not on every import)

        marker = self._read_record(ready_key(job.job_id))
        helpers = marker.get("helpers") if isinstance(marker, dict) else None
        for helper in helpers if isinstance(helpers, list) else ():
            with contextlib.suppress(KeyError, TypeError, ValueError, OSError):
                ref = ProcessRef.from_dict(helper)
                if is_alive(ref):  # the very process (its start time), not a reused pid
                    os.kill(ref.pid, signal.SIGKILL)

    async def read_result(self, job: JobRef) -> bytes:
        """The job's result payload. :raises ObjectNotFoundError: when there is none."""
        return await self.storage.read(protocol.result_key(job.job_id))

    async def delete_objects(self, job: JobRef) -> None:
        """Delete what the job stored."""
        await self.storage.delete_prefix(f"{job.job_id}/")

    async def list_job_ids(self) -> list[str]:
        def _scan() -> list[str]:
            root = self.storage.root
            if not root.is_dir():
                return []
            return sorted(
                entry.name
                for entry in os.scandir(root)
                if entry.name.startswith("job-") and (Path(entry.path) / "handle.json").is_file()
            )

        return await anyio.to_thread.run_sync(_scan)

    async def aclose(self) -> None:
        return None


MIN_FREE = 1 << 20
"""Bytes a local job needs free on its root's filesystem at launch (its output, result
and records): with less, its runner could not even record why it failed."""


def _check_free_space(path: Path) -> None:
    """Refuse to launch onto a (nearly) full filesystem: raise ``ENOSPC``. Blocking."""
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    if free < MIN_FREE:
        raise OSError(
            errno.ENOSPC,
            f"no space left for a job: {free} bytes free on the local root's filesystem "
            f"(a job needs at least {MIN_FREE})",
        )


def _gpu_wait_reason(record: dict[str, Any]) -> str:
    machine = ", ".join(str(gpu) for gpu in record.get("machine") or ())
    count = record.get("count")
    return f"waiting for {count} GPU(s): other jobs hold this machine's GPUs ({machine})"


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(1 << 20)
    except FileNotFoundError:
        return b""


@dataclass(frozen=True)
class _LocalLaunch:
    """A local job ready to start: the process is all there is to it."""

    backend: LocalBackend

    def with_gcs_fuse(self, buckets: Iterable[str]) -> _LocalLaunch:
        return self  # the job reads its data in place

    async def start(self, job: JobRef) -> None:
        await self.backend.launch(job)
