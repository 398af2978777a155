"""One build per image tag at a time, across processes and machines.

The lock is a marker object in the store every submitter of the project shares (the
jobs bucket on GKE): ``default/image-builds/{tag}.json``, created with
:meth:`~kinetic._storage.base.Storage.create_if_absent`, so exactly one caller wins.
The winner builds and deletes the marker (under a shield, also when the build fails).
Everyone else waits for the registry to list the tag (there is no watch for that:
it is asked every ``poll`` seconds), or for the marker to go away (the build failed:
one of them takes over). A marker older than ``stale_after`` belongs to a builder
that died without cleaning up, and is taken over.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable

import anyio

from kinetic._exceptions import ImageBuildError, ObjectNotFoundError
from kinetic._storage.base import Storage

DEFAULT_POLL = 2.0
DEFAULT_STALE_AFTER = 3600.0


def marker_key(tag: str) -> str:
    """The lock marker of one image tag."""
    return f"default/image-builds/{tag}.json"


async def build_once(
    storage: Storage,
    tag: str,
    *,
    is_built: Callable[[], Awaitable[bool]],
    build: Callable[[], Awaitable[None]],
    poll: float = DEFAULT_POLL,
    stale_after: float = DEFAULT_STALE_AFTER,
    wait_timeout: float = DEFAULT_STALE_AFTER,
) -> bool:
    """Make sure the image ``tag`` is built, building it here only if nobody else is.

    Returns True when this call built it, False when it existed or another process
    built it.

    :raises ImageBuildError: from ``build``; or waiting for another builder took over
        ``wait_timeout`` seconds.
    :raises StorageError, BackendError: the store or the registry failed.
    """
    key = marker_key(tag)
    me = {"owner": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid()}
    with anyio.move_on_after(wait_timeout) as waiting:
        while True:
            if await is_built():
                return False
            record = {**me, "created_at": time.time()}
            if await storage.create_if_absent(key, json.dumps(record).encode()):
                try:
                    # Checked again under the lock: a builder that finished between our
                    # check and our marker has released it with the tag pushed.
                    if await is_built():
                        return False
                    await build()
                finally:
                    with anyio.CancelScope(shield=True):
                        await storage.delete(key)
                return True
            await _drop_if_stale(storage, key, stale_after)
            await anyio.sleep(poll)
    assert waiting.cancelled_caught
    raise ImageBuildError(
        f"waited {wait_timeout:.0f}s for another process building image tag {tag}; "
        f"if no build is running, delete the marker {key!r} in {storage.url}"
    )


async def _drop_if_stale(storage: Storage, key: str, stale_after: float) -> None:
    try:
        record = json.loads(await storage.read(key))
        created = float(record.get("created_at", 0))
    except ObjectNotFoundError:
        return  # released meanwhile: try again
    except (ValueError, TypeError, AttributeError):
        created = 0.0  # unreadable marker: no live builder wrote it whole
    if time.time() - created > stale_after:
        await storage.delete(key)
