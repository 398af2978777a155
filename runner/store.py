"""The runner's view of storage: blocking read/write of whole objects.

A ``file://`` store is a plain directory (the local backend), read with the
standard library only. Stores for other URL schemes (``gs://``) are plug-ins: a
module registers an opener for its scheme (:func:`register_store`), and the process
that starts the runner names such modules in :data:`STORES_ENV`; the runner imports
them only when it first meets a scheme it has no store for, so local jobs start fast.
That is how the runner reaches GCS through Kinetic's own store without ever naming
``kinetic``: Kinetic's launchers name its module (:mod:`kinetic._core.store_plugins`),
and the runner runs where Kinetic is installed (a local job's interpreter, or an image
that carries Kinetic). Without a plug-in, the runner needs nothing but the standard
library and ``file://`` stores.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from runner import protocol, versioned
from runner.fs import atomic_copy, atomic_write, iter_files


class StoreUnavailable(OSError):
    """A storage failure that may pass (the service unreachable, overloaded, or answering
    5xx or 429 after the client's own retries): worth trying again later."""


class RunnerStore(Protocol):
    """Blocking whole-object access. Missing objects raise FileNotFoundError, failures
    that may pass :class:`StoreUnavailable`, others OSError."""

    def read(self, key: str) -> bytes: ...

    def write(self, key: str, data: bytes, *, fresh: bool = False) -> None:
        """Create or replace the object. ``fresh``: no object of that name was ever
        written (a unique name; a store with a per-name write rate retries a refusal
        sooner)."""
        ...

    def create_if_absent(self, key: str, data: bytes) -> bool:
        """Create the object unless one exists; whether it was created (atomic)."""
        ...

    def read_versioned(self, key: str) -> tuple[bytes, int]:
        """The object's bytes and its generation (which every change of it changes)."""
        ...

    def create_versioned(self, key: str, data: bytes) -> int | None:
        """:meth:`create_if_absent`, with the new object's generation (None: it existed)."""
        ...

    def replace_if(self, key: str, data: bytes, generation: int) -> int | None:
        """Replace the object if it is still at ``generation`` (atomic); its new
        generation, or None when it changed or is missing."""
        ...

    def download(self, key: str, path: Path) -> None:
        """Stream the object into ``path`` (parents created; written atomically)."""
        ...

    def list(self, prefix: str) -> list[str]: ...

    def close(self) -> None: ...


class FileStore:
    """Objects as files under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def read(self, key: str) -> bytes:
        return (self.root / key).read_bytes()

    def write(self, key: str, data: bytes, *, fresh: bool = False) -> None:
        atomic_write(self.root / key, data)

    def create_if_absent(self, key: str, data: bytes) -> bool:
        return self.create_versioned(key, data) is not None

    def read_versioned(self, key: str) -> tuple[bytes, int]:
        return versioned.read_versioned(self.root / key)

    def create_versioned(self, key: str, data: bytes) -> int | None:
        return versioned.create_versioned(self.root / key, data)

    def replace_if(self, key: str, data: bytes, generation: int) -> int | None:
        return versioned.replace_if(self.root / key, data, generation)

    def download(self, key: str, path: Path) -> None:
        with open(self.root / key, "rb") as src:
            atomic_copy(src, path)

    def list(self, prefix: str) -> list[str]:
        base = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        keys = (p.relative_to(self.root).as_posix() for p in iter_files(base))
        return sorted(k for k in keys if k.startswith(prefix))

    def close(self) -> None:
        return None


STORES_ENV = "KINETIC_RUNNER_STORES"
"""The environment variable naming the modules (comma-separated) that register stores
for other URL schemes than ``file://``."""

Opener = Callable[[str], RunnerStore]
"""Opens the store of a URL (the whole URL).

:raises ValueError: for a URL of its scheme that names no store (the message says why).
"""

_OPENERS: dict[str, Opener] = {}


def register_store(scheme: str, opener: Opener) -> None:
    """Open URLs ``{scheme}://...`` with ``opener`` (a plug-in calls this on import)."""
    _OPENERS[scheme] = opener


def _unrecorded(message: str) -> SystemExit:
    """A failure before any store is open, so that no record can say it: its words go
    where a pod's status shows them (:data:`runner.protocol.TERMINATION_LOG`), as a
    failure in phase ``fetch``, and to stderr."""
    with contextlib.suppress(OSError):
        # Never created: only a container has the file (and writing it is all it takes).
        fd = os.open(protocol.TERMINATION_LOG, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
        with open(fd, "w", encoding="utf-8") as log:
            log.write(protocol.unrecorded_failure("fetch", message))
    return SystemExit(f"kinetic runner: {message}")


def _load_plugins(url: str) -> None:
    for name in filter(None, (n.strip() for n in os.environ.get(STORES_ENV, "").split(","))):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise _unrecorded(
                f"cannot open {url!r}: the store module {name!r} "
                f"({STORES_ENV}) cannot be imported here: {exc}"
            ) from None


def open_store(url: str) -> RunnerStore:
    """Open the store named by ``file:///abs/dir``, or by a URL of a scheme a plug-in
    registered (``gs://bucket``: see the module's docstring).

    :raises SystemExit: for a URL that names no store, or a store that cannot be loaded
        here, or (:data:`runner.protocol.PYTHON_ENV`) a runner of another Python than
        the submitting one's (the message says why, in the pod's status too).
    """
    wanted, here = os.environ.get(protocol.PYTHON_ENV), protocol.python_version()
    if wanted and wanted != here:
        raise _unrecorded(protocol.wrong_python(wanted, here))
    if url.startswith("file://"):
        from urllib.parse import unquote  # only for paths with escapes

        path = url.removeprefix("file://")
        return FileStore(Path(unquote(path) if "%" in path else path))
    scheme, sep, _ = url.partition("://")
    if sep and scheme not in _OPENERS:
        _load_plugins(url)
    opener = _OPENERS.get(scheme) if sep else None
    if opener is None:
        raise SystemExit(
            f"kinetic runner: unsupported storage URL {url!r} (no store for it: "
            f"{STORES_ENV} names the modules that add them)"
        )
    try:
        return opener(url)
    except ValueError as exc:
        raise SystemExit(f"kinetic runner: unsupported storage URL {url!r}: {exc}") from None
