"""A fresh process's first GKE jobs import nothing on the caller's event loop (the
testbed): the twin of :mod:`tests.local.test_first_use`, where the lazily imported code
is largest (aiohttp, gcloud-aio-storage and the Kubernetes client: 0.4 s of CPU)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fix_cluster import GKETarget
from tests.local.test_first_use import loop_thread_imports

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def test_a_first_gke_job_imports_nothing_on_the_loop(gke: GKETarget, tmp_path: Path) -> None:
    seen = loop_thread_imports(tmp_path / "project", gke.run_args(), dict(os.environ))
    assert seen == [], f"imported on the caller's loop: {seen}"
