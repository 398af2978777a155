"""The blocking ``DebugForward``: declarations over :class:`kinetic._debug.forward.DebugForward`.

The forward runs on its own loop thread (see :mod:`kinetic._debug.forward`), so closing
it needs no crossing into the facade's loop.
"""

from __future__ import annotations

from typing import Any, Self

from kinetic._debug.forward import DebugForward as _AioDebugForward


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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
