"""The blocking ``DebugForward``: declarations over :class:`kinetic._debug.forward.DebugForward`.

The forward runs on its own loop thread (see :mod:`kinetic._debug.forward`), so closing
it needs no crossing into the facade's loop.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any, Self

from kinetic._debug.forward import DebugForward as _AioDebugForward

_WAIT_POLL = 0.05


class DebugForward:
    """A running forward to a debug job's debugger (blocking API). Close it with
    ``close()`` or use it as ``with``; see ``kinetic.aio.JobHandle.debug_attach``."""

    def __init__(self, aio: _AioDebugForward) -> None:
        self.aio = aio

    def __repr__(self) -> str:
        return repr(self.aio)

    @property
    def job_id(self) -> str:
        return self.aio.job_id

    @property
    def local_port(self) -> int:
        return self.aio.local_port

    @property
    def target(self) -> str:
        return self.aio.target

    @property
    def launch_config(self) -> dict[str, Any]:
        return self.aio.launch_config

    @property
    def errors(self) -> list[str]:
        return self.aio.errors

    @property
    def closed(self) -> bool:
        return self.aio.closed

    def close(self) -> None:
        """Stop listening and end every relayed connection (the job keeps running)."""
        self.aio.close_blocking()

    # The original's debug_attach returned its ``kubectl port-forward`` process: the
    # same shape (terminate, wait, poll, returncode), so code written for it works.

    def terminate(self) -> None:
        """:meth:`close`, by the name a port-forward process has."""
        self.close()

    kill = terminate

    def poll(self) -> int | None:
        """None while the forward serves, else 0 (it was closed)."""
        return 0 if self.closed else None

    @property
    def returncode(self) -> int | None:
        """As :meth:`poll`."""
        return self.poll()

    def wait(self, timeout: float | None = None) -> int:
        """Block until the forward is closed (by :meth:`terminate`, another thread, or
        its own failure); return 0.

        :raises subprocess.TimeoutExpired: when ``timeout`` seconds pass first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.closed:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"debug forward of {self.job_id}", timeout or 0)
            time.sleep(_WAIT_POLL)
        return 0

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
