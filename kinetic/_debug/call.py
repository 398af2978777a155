"""Calling a ``debug=True`` function (``fn(...)``, ``await fn.aio(...)``): submit the
job, forward its debugger to this machine, say how to attach, and wait for its value.

The forward listens on ``127.0.0.1:5678`` (debugpy's and VS Code's default), or a free
port when that one is taken; it is closed when the call returns, fails or is cancelled
(the job itself is left as it is: cancelling the call never cancels the job).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import anyio

from kinetic._exceptions import ConfigError

if TYPE_CHECKING:
    from kinetic._debug.forward import DebugForward
    from kinetic._engine.handle import JobHandle

DEFAULT_PORT = 5678


async def debug_call(handle: JobHandle) -> Any:
    """Forward ``handle``'s debugger, print how to attach, and return the job's value.

    :raises: as :meth:`JobHandle.debug_attach` (the job failed or ended before its
        debugger was ready) and :meth:`JobHandle.result`.
    """
    forward = await _attach(handle)
    try:
        print(instructions(forward), file=sys.stdout, flush=True)
        return await handle.result(stream_logs=False)
    finally:
        with anyio.CancelScope(shield=True):
            await forward.close()


async def _attach(handle: JobHandle) -> DebugForward:
    try:
        return await handle.debug_attach(local_port=DEFAULT_PORT, timeout=None)
    except ConfigError as exc:
        if "in use" not in str(exc):
            raise
    return await handle.debug_attach(local_port=0, timeout=None)  # 5678 is taken: any


def instructions(forward: DebugForward) -> str:
    """How to attach, in words, after the launch configuration :func:`debug_attach`
    printed."""
    port = forward.local_port
    return (
        f"kinetic: job {forward.job_id} waits for your debugger on 127.0.0.1:{port}. "
        "Attach with the configuration above (VS Code: add it to .vscode/launch.json "
        f"and start it; PyCharm: a Python Debug Server on port {port}; any DAP client: "
        f"connect to 127.0.0.1:{port}); set breakpoints in your function first. This "
        "call returns the function's value when the job ends."
    )
