"""The local backend: each job is a detached process group running ``runner``.

Theory of operation. Submission stores the job's spec, payload and handle in a
local directory store, then :meth:`LocalBackend.launch` starts
``python -m runner`` (the current interpreter) in a new session through a tiny
shell wrapper, with output going to the job's ``logs.txt`` and the runner's
exit status to ``exit_code``. The launch record (pid, start time, process
group) lets any process, not only the submitter, tell whether the job is alive.

Status is derived from records plus liveness (see
:func:`kinetic._core.status.status_from_local_records`): the runner's final
record wins; a process that vanished without one is FAILED, with the signal or
exit status as the reason. Waiting uses a pidfd, not a polling loop.

Contexts: every job and batch supervisor started from this root is told (in
``KINETIC_CONTEXT_CACHE``) to share extracted contexts under ``{root}/contexts``: one
read-only extraction per content address, each job with its own working directory
(:mod:`runner.contexts`).

Inputs of a batch (``group_id`` set) are run by the batch supervisor
(:mod:`runner.batch`, driven through :mod:`kinetic._backends.local_batch`); the
same methods answer for them from the batch's records and event stream.
"""

from __future__ import annotations

import codecs
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import cloudpickle

import runner
from kinetic._backends._process import (
    ProcessRef,
    is_alive,
    signal_group,
    spawn_detached,
    wait_exit,
)
from kinetic._backends.base import JobRef, StatusCallback, logs_once_over
from kinetic._backends.local_batch import LocalBatches, event_chunks
from kinetic._backends.local_launcher import spawn_via_launcher
from kinetic._core.status import (
    GPU_WAIT_REASON,
    JobStatus,
    StatusReport,
    settled_input_report,
    status_from_local_records,
    unsettled_input_report,
)
from kinetic._exceptions import ObjectNotFoundError
from kinetic._storage.local import LocalStorage
from runner import protocol
from runner.contexts import CACHE_ENV
from runner.fs import atomic_write
from runner.gpu_lease import group_wait_key, job_gpus_key

_LAUNCH = "launch.json"
_EXIT = "exit_code"
_CANCEL = "cancel.json"
_CANCEL_GRACE = 3.0
# There is no portable "file grew" event: following a log re-reads it at this pace.
_LOG_POLL = 0.1
# Makes our own `runner` importable by jobs even when Kinetic runs from a source tree.
_RUNNER_HOME = os.path.dirname(os.path.dirname(os.path.abspath(runner.__file__)))


def job_environment(context_cache: Path | None = None) -> dict[str, str]:
    """The environment local jobs start with: ours, unbuffered, with ``runner`` importable.

    :param context_cache: where jobs share extracted contexts (:mod:`runner.contexts`).
    """
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"  # so followed logs arrive as they are printed
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), _RUNNER_HOME) if p)
    if context_cache is not None:
        env[CACHE_ENV] = str(context_cache)
    return env


class LocalBackend:
    """Runs jobs as local processes; storage is a directory.

    :param root: the local root (``KINETIC_LOCAL_ROOT``); objects live in ``root/storage``.
    """

    name = "local"

    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()
        self.storage = LocalStorage(self.root / "storage")
        # Extracted contexts, shared read-only by the jobs (and batches) of this root.
        self.contexts = self.root / "contexts"
        self.batches = LocalBatches(self.storage, job_environment(self.contexts))

    def __repr__(self) -> str:
        return f"LocalBackend({str(self.root)!r})"

    def _key(self, job: JobRef, name: str) -> str:
        return f"{job.job_id}/{name}"

    async def launch(self, job: JobRef) -> None:
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
            job_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            log_file = self.storage.path_for(protocol.logs_key(job.job_id))
            status_file = self.storage.path_for(self._key(job, _EXIT))
            # cwd: not the user's; a local `runner` package must not shadow ours. The root's
            # warm launcher forks the job; a new interpreter starts it when it cannot.
            ref = spawn_via_launcher(
                argv,
                root=self.root,
                log_file=log_file,
                status_file=status_file,
                cwd=job_dir,
                env=env,
            ) or spawn_detached(
                argv, log_file=log_file, status_file=status_file, cwd=job_dir, env=env
            )
            launch = self.storage.path_for(self._key(job, _LAUNCH))
            atomic_write(launch, protocol.dump_json(ref.to_dict()))

        await anyio.to_thread.run_sync(_spawn)

    async def _read_json(self, key: str) -> Any:
        try:
            return protocol.load_json(await self.storage.read(key))
        except (ObjectNotFoundError, ValueError):  # absent, or being written right now
            return None

    async def _process(self, job: JobRef) -> ProcessRef | None:
        launch = await self._read_json(self._key(job, _LAUNCH))
        return None if launch is None else ProcessRef.from_dict(launch)

    async def status(self, job: JobRef) -> StatusReport:
        if job.group_id is not None:
            return await self._member_status(job)
        final = await self._read_json(protocol.final_key(job.job_id))
        if final is not None:
            return status_from_local_records(
                final=final, cancelled=False, launched=True, alive=False, exit_code=None
            )
        ref = await self._process(job)
        alive = ref is not None and is_alive(ref)
        exit_code = None
        if ref is not None and not alive:
            # The runner writes its final record before exiting: look again.
            final = await self._read_json(protocol.final_key(job.job_id))
            raw = await self._read_json(self._key(job, _EXIT))
            exit_code = raw if isinstance(raw, int) else None
        if ref is None and not await self.storage.exists(protocol.handle_key(job.job_id)):
            return StatusReport(JobStatus.NOT_FOUND, reason="no records for this job")
        report = status_from_local_records(
            final=final,
            cancelled=await self.storage.exists(self._key(job, _CANCEL)),
            launched=ref is not None,
            alive=alive,
            exit_code=exit_code,
        )
        if report.status is JobStatus.RUNNING:
            gpus = await self._read_json(job_gpus_key(job.job_id))
            if isinstance(gpus, dict) and gpus.get("state") == "waiting":
                return StatusReport(JobStatus.PENDING, reason=_gpu_wait_reason(gpus))
        return report

    async def wait(self, job: JobRef, on_change: StatusCallback | None = None) -> StatusReport:
        last = None
        while True:
            report = await self.status(job)
            if on_change is not None and report.status != last:
                await on_change(report)
            last = report.status
            if report.status.is_terminal:
                return report
            if job.group_id is not None:
                await self._member_event(job)
                continue
            ref = await self._process(job)
            if ref is None:
                # Recorded but not launched yet (another process is launching it).
                await anyio.sleep(_LOG_POLL)
            else:
                await wait_exit(ref)

    async def logs(self, job: JobRef, *, tail: int | None = None) -> str:
        if job.group_id is not None:
            text = await self.batches.member_logs(job.group_id, _index(job))
        else:
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
        if job.group_id is not None:
            async for text in logs_once_over(self, job, finished):
                yield text
            return
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
        if job.group_id is not None:
            await self._member_cancel(job)
            return
        if await self.storage.exists(protocol.final_key(job.job_id)):
            return  # already over: nothing to cancel, and its record must stay truthful
        await self.storage.write(self._key(job, _CANCEL), protocol.dump_json({"cancelled": True}))
        ref = await self._process(job)
        if ref is None:
            return
        signal_group(ref, signal.SIGTERM)
        with anyio.move_on_after(_CANCEL_GRACE):
            await wait_exit(ref)
            return
        signal_group(ref, signal.SIGKILL)
        await wait_exit(ref)

    async def read_result(self, job: JobRef) -> bytes:
        """The job's result payload. :raises ObjectNotFoundError: when there is none."""
        if job.group_id is None:
            return await self.storage.read(protocol.result_key(job.job_id))
        _, payload = await self.batches.read_member(job.group_id, _index(job))
        return payload

    async def delete_objects(self, job: JobRef) -> None:
        """Delete what the job stored (a batch input: its result only)."""
        # A batch input's result is a record in a shared log: it goes with its batch's cleanup.
        if job.group_id is None:
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

    # -- batch inputs ------------------------------------------------------------------

    async def _member_status(self, job: JobRef) -> StatusReport:
        group_id, index = str(job.group_id), _index(job)
        header: protocol.OutcomeHeader | None
        try:
            header, _ = await self.batches.read_member(group_id, index)
        except ObjectNotFoundError:
            header = None
        stop = None if header is not None else await self.batches.read_stop(group_id)
        settled = settled_input_report(header, stop)
        if settled is not None:
            return settled
        recorded = await self.storage.exists(protocol.group_manifest_key(group_id))
        running = recorded and await anyio.to_thread.run_sync(
            self.batches.supervisor_running, group_id
        )
        waiting = running and await self.storage.exists(group_wait_key(group_id))
        return unsettled_input_report(
            recorded=recorded, running=running, waiting=GPU_WAIT_REASON if waiting else None
        )

    async def _member_event(self, job: JobRef) -> None:
        """Return once input ``job`` may have changed state (its batch reported, or ended)."""
        group_id, index = str(job.group_id), _index(job)
        stream = await self.batches.connect(group_id)
        if stream is None:
            if not await anyio.to_thread.run_sync(self.batches.supervisor_running, group_id):
                await self.batches.launch(group_id)  # resume a batch nobody drives
            await anyio.sleep(_LOG_POLL)
            return
        async with stream:
            async for events in event_chunks(stream):
                if any(i == index for i, _ in events.done):
                    return

    async def _member_cancel(self, job: JobRef) -> None:
        group_id, index = str(job.group_id), _index(job)
        if await self.batches.load_many(group_id, [index]):
            return  # already finished
        if not await self.batches.send(group_id, f"c {index}"):
            header = protocol.cancelled_header()
            payload = protocol.result_payload(success=False, error="cancelled")
            await self.batches.record_member(group_id, index, header, cloudpickle.dumps(payload))


def _gpu_wait_reason(record: dict[str, Any]) -> str:
    machine = ", ".join(str(gpu) for gpu in record.get("machine") or ())
    count = record.get("count")
    return f"waiting for {count} GPU(s): other jobs hold this machine's GPUs ({machine})"


def _index(job: JobRef) -> int:
    index = job.group_index
    if index is None:
        raise ValueError(f"job {job.job_id} belongs to a batch but has no index")
    return index


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(1 << 20)
    except FileNotFoundError:
        return b""
