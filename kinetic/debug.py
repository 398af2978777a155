"""Helpers for debug jobs, under the original's names.

``JobHandle.debug_attach()`` returns the running forward (``terminate()``, ``wait()``,
``poll()``, as the original's port-forward process); :func:`cleanup_port_forward` ends
it, as the original's did its process.
"""

from __future__ import annotations

import subprocess
from typing import Any

__all__ = ["cleanup_port_forward"]


def cleanup_port_forward(proc: Any, timeout: float = 10.0) -> None:
    """End a debug port-forward: what ``debug_attach()`` returned (blocking or
    ``kinetic.aio`` flavour), or a port-forward process of your own. Idempotent; the
    job keeps running.

    :param timeout: seconds a process may take to exit before it is killed.
    """
    if proc is None:
        return
    close_blocking = getattr(proc, "close_blocking", None)
    if close_blocking is not None:  # kinetic.aio's DebugForward
        close_blocking()
        return
    if getattr(proc, "poll", lambda: None)() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)
