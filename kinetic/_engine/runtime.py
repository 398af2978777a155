"""Backends in use by this process, one set per event loop.

Network clients (aiohttp sessions, Kubernetes API clients, watches) belong to
the loop that created them, so the registry is keyed by the running loop; the
sync facade's private loop and a user's own loop each get their own.
"""

from __future__ import annotations

import asyncio
import weakref
from pathlib import Path

from kinetic._backends.base import Backend
from kinetic._backends.local import LocalBackend
from kinetic._core.config import Settings
from kinetic._exceptions import ConfigError

_REGISTRIES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, ...], Backend]]
_REGISTRIES = weakref.WeakKeyDictionary()


def _registry() -> dict[tuple[str, ...], Backend]:
    loop = asyncio.get_running_loop()
    return _REGISTRIES.setdefault(loop, {})


def local_backend(root: str | Path) -> LocalBackend:
    """The local backend rooted at ``root`` (``KINETIC_LOCAL_ROOT``)."""
    key = ("local", str(Path(root).absolute()))
    registry = _registry()
    backend = registry.get(key)
    if backend is None:
        backend = registry[key] = LocalBackend(Path(root))
    assert isinstance(backend, LocalBackend)
    return backend


def backend_for_settings(settings: Settings) -> Backend:
    """The backend a new job with these settings runs on.

    :raises ConfigError: when that backend is not available in this build.
    """
    if settings.backend == "local":
        return local_backend(settings.local_root)
    raise ConfigError(f"backend {settings.backend!r} is not available yet; use backend='local'")


def backend_for_location(backend: str, bucket_name: str, namespace: str) -> Backend:
    """The backend that owns a job recorded with these handle fields."""
    if backend == "local":
        # A local job's bucket_name is its storage directory: the root is its parent.
        return local_backend(Path(bucket_name).parent)
    raise ConfigError(f"backend {backend!r} is not available yet")
