"""Poll a Google long-running operation until it is done: one loop for every API.

GKE's Container API and Artifact Registry both answer a slow change with an operation
to poll; their documents differ (each API module parses its own), the waiting does not.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

import anyio

from kinetic._exceptions import BackendError, JobTimeoutError


class LongOperation(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def done(self) -> bool: ...
    @property
    def error(self) -> str | None: ...


Op = TypeVar("Op", bound=LongOperation)


async def poll_until_done(
    op: Op,
    *,
    fetch: Callable[[str], Awaitable[Mapping[str, Any] | None]],
    parse: Callable[[Mapping[str, Any]], Op],
    interval: float,
    timeout: float,
    label: Callable[[Op], str],
    late: Callable[[Op], str],
    tick: Callable[[Op, float], None] | None = None,
) -> Op:
    """Fetch ``op`` again every ``interval`` seconds until it is done; return it.

    :param fetch: the operation's document by name (None when it is gone).
    :param parse: reads a document (raising ValueError for something else).
    :param label: how messages name the operation (``"GKE operation X (KIND)"``).
    :param late: the message when ``timeout`` ran out (it says the operation goes on).
    :param tick: called before each wait with the operation and the seconds so far.
    :raises BackendError: the operation failed (its message), vanished, or the answer
        was not an operation.
    :raises JobTimeoutError: not done within ``timeout`` seconds (it goes on).
    """
    start = anyio.current_time()
    try:
        with anyio.fail_after(timeout):
            while not op.done:
                if tick is not None:
                    tick(op, anyio.current_time() - start)
                await anyio.sleep(interval)
                doc = await fetch(op.name)
                if doc is None:
                    raise BackendError(f"{label(op)} vanished")
                try:
                    op = parse(doc)
                except ValueError as exc:
                    raise BackendError(
                        f"{label(op)}: the answer is not an operation ({exc})"
                    ) from exc
    except TimeoutError as exc:
        raise JobTimeoutError(late(op)) from exc
    if op.error:
        raise BackendError(f"{label(op)} failed: {op.error}")
    return op
