"""A module whose import starts a thread, as ``import numpy`` does (its BLAS pool), and
torch and most ML libraries too. A job whose function lives here runs threads from the
moment its payload is unpickled: before its runner places its volumes or starts its
debugger, which need namespaces that the kernel grants to one thread only."""

from __future__ import annotations

import os
import threading

# It ends by itself (a test process that imports this module keeps no thread for long).
_POOL = threading.Thread(
    target=threading.Event().wait, args=(60.0,), name="pool-at-import", daemon=True
)
_POOL.start()


def listing(path: str) -> dict[str, object]:
    """What a job of this module sees at ``path``, and how many threads it runs."""
    return {
        "entries": sorted(os.listdir(path)) if os.path.isdir(path) else None,
        "threads": threading.active_count(),
    }
