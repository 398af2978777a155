"""Copy the job's output to storage while it still reaches the container log.

The process's stdout/stderr file descriptors are pointed at a pipe; a thread
copies what arrives to the original stdout and to a spool file, which is
uploaded as the job's log object when the job ends (so logs outlive the pod).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from collections.abc import Iterator

from runner.store import RunnerStore


@contextlib.contextmanager
def captured_output(store: RunnerStore, key: str) -> Iterator[None]:
    """Tee fds 1 and 2 into a spool file; upload it to ``key`` on exit."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 1)
    os.dup2(write_fd, 2)
    os.close(write_fd)
    spool = tempfile.TemporaryFile()  # noqa: SIM115 - closed in the finally below

    def pump() -> None:
        while chunk := os.read(read_fd, 65536):
            os.write(saved_out, chunk)
            spool.write(chunk)

    thread = threading.Thread(target=pump, name="kinetic-tee", daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)  # closes the pipe's last writer: the pump sees EOF
        thread.join(timeout=10)
        os.close(read_fd)
        os.close(saved_err)
        os.close(saved_out)
        spool.seek(0)
        try:
            store.write(key, spool.read())
        except Exception as exc:  # noqa: BLE001 - losing the log copy must not fail the job
            print(f"kinetic runner: could not upload logs ({exc})", file=sys.stderr)
        spool.close()
