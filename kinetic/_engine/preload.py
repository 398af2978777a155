"""The code a backend runs on, imported before the caller's loop needs it.

Kinetic imports each backend's modules on first use, so that ``import kinetic`` stays
cheap. The first use comes inside the caller's event loop, though, and an import holds
the loop for as long as it runs: the GKE backend's modules (aiohttp, gcloud-aio-storage,
...) took 0.4 s of CPU on a 2-core machine, and even the local backend's requirements
check 27 ms, while every other task of the application waited. So each entry point
that reads the settings in a worker thread (submission, ``attach``, ``list_jobs``,
``attach_batch``) also imports there what the chosen backend will need
(:func:`settings_with_code`); the loop then only finds the modules in ``sys.modules``.

:data:`BACKEND_CODE` names, per backend, the modules that otherwise would be imported
on the loop; ``tests/local/test_first_use.py`` and ``tests/cluster/test_first_use_gke.py``
fail when a fresh process's first jobs import anything on the loop's thread.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Mapping
from typing import Any

from kinetic._core.config import Settings
from kinetic._settings import load_settings

# anyio imports its asyncio backend (16 modules, ~10 ms) on the first anyio call in a
# process, and in an asyncio application that call is Kinetic's, inside the caller's
# loop: imported with Kinetic instead. Where a later anyio moves it, nothing is lost
# but that.
with contextlib.suppress(ImportError):
    importlib.import_module("anyio._backends._asyncio")

_CLUSTER_CODE = (
    "kinetic._backends.gke.backend",
    "kinetic._backends.gke.client",
    # Which service account a job's pod runs as (asked once per backend, at submission).
    "kinetic._backends.gke.pod_identity",
    # Execution modes: requirements, the bundled image's builders and registries.
    "kinetic._engine.requirements_io",
    "kinetic._images.modes",
    "kinetic._images.docker",
    "kinetic._images.cloudbuild",
)

BACKEND_CODE: Mapping[str, tuple[str, ...]] = {
    "local": ("kinetic._engine.requirements_io",),
    "gke": _CLUSTER_CODE,
    "pathways": (*_CLUSTER_CODE, "kinetic._backends.pathways.backend"),
}


def import_backend_code(backend: str) -> None:
    """Import the modules :data:`BACKEND_CODE` lists for ``backend`` (none for an unknown
    name: choosing the backend reports that), and build the TLS trust context the
    cluster backends' sessions share (loading the CA store: tens of ms, also not for
    the loop). Blocking: call it in a worker thread."""
    for name in BACKEND_CODE.get(backend, ()):
        importlib.import_module(name)
    if backend in ("gke", "pathways"):
        from kinetic._exceptions import ConfigError
        from kinetic._net import trust_context

        with contextlib.suppress(ConfigError):  # reported where a connection needs it
            trust_context()


def settings_with_code(**options: Any) -> Settings:
    """:func:`~kinetic._settings.load_settings` with ``options``, and the code of the
    backend they choose imported. Blocking (reads the profiles file, imports): call it
    in a worker thread.

    :raises ConfigError: as ``load_settings``.
    """
    settings = load_settings(**options)
    import_backend_code(settings.backend)
    return settings
