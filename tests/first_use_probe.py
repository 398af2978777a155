"""A fresh interpreter's first jobs, watched for imports on the event loop's thread.

Run as ``python tests/first_use_probe.py '<json of kinetic.aio.run arguments>'`` from a
project directory holding ``probe_jobs.py`` (a ``square`` function). It imports Kinetic
and the user's module first, as an application does at start-up; then, inside
``asyncio.run``, it submits a job, awaits its result, status and logs, attaches to it,
lists jobs, and runs a small batch through ``as_completed``, while an import hook
records every module imported on the loop's thread. It prints that list as JSON: an
import there holds every other task of the caller's loop for as long as it runs.
"""

from __future__ import annotations

import asyncio
import importlib.abc
import importlib.machinery
import json
import sys
import threading
from collections.abc import Sequence
from types import ModuleType

import probe_jobs  # type: ignore[import-not-found]

from kinetic import aio


class LoopImports(importlib.abc.MetaPathFinder):
    """Records the modules first imported on ``thread`` while ``watching``."""

    def __init__(self, thread: threading.Thread) -> None:
        self.thread = thread
        self.watching = False
        self.seen: list[str] = []

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if self.watching and threading.current_thread() is self.thread and name not in sys.modules:
            self.seen.append(name)
        return None  # the normal finders import it


async def first_use(spy: LoopImports, options: dict[str, object]) -> None:
    fn = aio.run(**options)(probe_jobs.square)
    where = {k: options[k] for k in ("backend", "project", "cluster") if k in options}
    spy.watching = True
    job = await fn.run_async(7)
    assert await job.result(timeout=180, cleanup=False) == 49
    await job.status()
    await job.logs()
    again = await aio.attach(job.job_id, **where)  # type: ignore[arg-type]
    await again.status()
    await aio.list_jobs(**where)  # type: ignore[arg-type]
    batch = await fn.run_async_map(range(3))
    async for h in batch.as_completed(timeout=180):
        await h.result()
    await batch.cleanup()
    await job.cleanup()
    spy.watching = False


def main() -> None:
    spy = LoopImports(threading.current_thread())
    sys.meta_path.insert(0, spy)
    asyncio.run(first_use(spy, json.loads(sys.argv[1])))
    print(json.dumps(spy.seen))


if __name__ == "__main__":
    main()
