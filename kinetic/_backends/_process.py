"""Detached processes that outlive us: spawn, identify, await exit, signal.

A job is started through ``/bin/sh`` in a new session: the session leader
forks a subshell that runs the runner and then records the runner's exit
status, and exits at once, so the job is re-parented to init and never
becomes our zombie. We follow the subshell by pid *and* start time (so a
recycled pid is never mistaken for the job) and learn of its exit through a
pidfd, which works for processes that are not our children.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio

from kinetic._exceptions import BackendError
from runner.procstat import START_TICKS, STATE, start_ticks, stat_fields

# $1: the log file, $2: the exit-status file; the rest is the command. The subshell
# must not hold our stdout pipe, or reading the pid would wait for the whole job.
# The status is written with a builtin (one small write): `mv` would cost a fork+exec.
_WRAPPER = """
log=$1; status=$2; append=$3; shift 3
[ "$append" = 1 ] || : > "$log"
( "$@" >> "$log" 2>&1; echo $? > "$status" ) \
    < /dev/null > /dev/null 2>&1 &
echo $!
"""


@dataclass(frozen=True)
class ProcessRef:
    """A process identified across pid reuse."""

    pid: int
    start_ticks: int
    pgid: int

    def to_dict(self) -> dict[str, int]:
        return {"pid": self.pid, "start_ticks": self.start_ticks, "pgid": self.pgid}

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> ProcessRef:
        return cls(int(str(d["pid"])), int(str(d["start_ticks"])), int(str(d["pgid"])))


def is_alive(ref: ProcessRef) -> bool:
    """Whether the very process ``ref`` names is still running (zombies count as gone)."""
    fields = stat_fields(ref.pid)
    return (
        fields is not None and fields[STATE] != "Z" and int(fields[START_TICKS]) == ref.start_ticks
    )


def spawn_detached(
    argv: Sequence[str],
    *,
    log_file: Path,
    status_file: Path,
    cwd: Path,
    env: Mapping[str, str],
    append_log: bool = False,
) -> ProcessRef:
    """Start ``argv`` detached in its own session. Blocking: call from a worker thread.

    :param append_log: add to ``log_file`` rather than start it anew (a relaunched
        process keeps what the one before it said: how it ended, say).
    :raises BackendError: when the process cannot be started.
    """
    append = "1" if append_log else "0"
    try:
        launcher = subprocess.run(
            [
                "/bin/sh",
                "-c",
                _WRAPPER,
                "kinetic-job",
                str(log_file),
                str(status_file),
                append,
                *argv,
            ],
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            start_new_session=True,
            check=True,
            timeout=30,
        )
        pid = int(launcher.stdout.decode().strip())
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise BackendError(f"could not start the job process: {exc}") from exc
    ticks = start_ticks(pid)
    if ticks is None:
        # It already finished; record an identity that can never match a live process.
        ticks = -1
    # The session leader was the launcher shell: its pid is the job's process group.
    return ProcessRef(pid=pid, start_ticks=ticks, pgid=os.getpgid(pid) if ticks >= 0 else pid)


async def wait_exit(ref: ProcessRef, *, poll_cap: float = 0.5) -> None:
    """Return once the process ``ref`` names has exited.

    Uses a pidfd (readable when the process ends). Where the kernel offers none,
    falls back to checking ``/proc`` with a backoff capped at ``poll_cap`` seconds.
    Cancellable at any point.
    """
    if not is_alive(ref):
        return
    fd = _pidfd(ref.pid)
    if fd is not None:
        try:
            if not is_alive(ref):  # the pid may have been recycled before pidfd_open
                return
            await anyio.wait_readable(fd)
        finally:
            os.close(fd)
        return
    delay = 0.005
    while is_alive(ref):
        await anyio.sleep(delay)
        delay = min(delay * 2, poll_cap)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    except (AttributeError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno not in (errno.ENOSYS, errno.EPERM, errno.EINVAL):
            raise
        return None


def signal_group(ref: ProcessRef, sig: int = signal.SIGTERM) -> None:
    """Send ``sig`` to the job's process group, if the job is still alive."""
    if not is_alive(ref):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(ref.pgid, sig)
