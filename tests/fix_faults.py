"""The testbed behind fault proxies, for the cluster tier's fault tests.

A plugin (``tests/conftest.py``): the ``faulty`` fixture points the test's jobs at
:class:`tests.faultproxy.FaultProxy` instances in front of fake-gcs-server
(``STORAGE_EMULATOR_HOST``, which the pods inherit) and the kube-apiserver (a kubeconfig
whose server is the proxy, serving TLS), with no faults until a test sets them.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from kinetic import JobStatus
from kinetic._engine import runtime
from kinetic._engine.handle import JobHandle
from kinetic._sync import portal
from tests.faultproxy import FaultProxy, Faults, proxies
from tests.fix_cluster import GKETarget

NONE = Faults()


def slow_triple(x: float) -> float:
    time.sleep(x)
    return 3 * x


@dataclass
class Faulty:
    """The testbed behind two fault proxies."""

    gke: GKETarget
    storage: FaultProxy
    api: FaultProxy

    def set(self, storage: Faults, api: Faults) -> None:
        self.storage.set_faults(storage)
        self.api.set_faults(api)

    def snapshot(self) -> dict[str, Counter[str]]:
        return {"storage": Counter(self.storage.counts), "api": Counter(self.api.counts)}

    def since(self, before: dict[str, Counter[str]]) -> dict[str, dict[str, int]]:
        now = self.snapshot()
        out: dict[str, dict[str, int]] = {}
        for side in ("storage", "api"):
            diff = now[side] - before[side]
            diff["injected"] = sum(
                n for k, n in diff.items() if k.startswith(("status-", "reset-"))
            )
            out[side] = dict(sorted(diff.items()))
        return out

    def put_object(self, key: str, data: bytes) -> None:
        """Overwrite an object, straight on the emulator (not through the proxy)."""
        quoted = urllib.request.quote(key, safe="")
        req = urllib.request.Request(
            f"{self.gke.emulator}/upload/storage/v1/b/{self.gke.bucket}/o"
            f"?uploadType=media&name={quoted}",
            data=data,
            headers={"Content-Type": "application/octet-stream"},
            method="POST",
        )
        urllib.request.urlopen(req, timeout=10).close()

    def get_object(self, key: str) -> bytes:
        quoted = urllib.request.quote(key, safe="")
        url = f"{self.gke.emulator}/storage/v1/b/{self.gke.bucket}/o/{quoted}?alt=media"
        with urllib.request.urlopen(url, timeout=10) as resp:
            data: bytes = resp.read()
            return data


def proxied_kubeconfig(source: Path, server: str, target: Path) -> Path:
    """A copy of the testbed's kubeconfig whose clusters are reached through ``server``
    (the proxy's certificate is its own: verification is skipped)."""
    import yaml

    doc = yaml.safe_load(source.read_text())
    for entry in doc.get("clusters") or []:
        cluster = entry["cluster"]
        cluster.pop("certificate-authority-data", None)
        cluster.pop("certificate-authority", None)
        cluster["server"] = server
        cluster["insecure-skip-tls-verify"] = True
    target.write_text(json.dumps(doc))
    return target


@pytest.fixture
def faulty(gke: GKETarget, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Faulty]:
    kubeconfig = Path(os.environ["KUBECONFIG"])
    server = "https://127.0.0.1:6443"
    import yaml

    clusters = yaml.safe_load(kubeconfig.read_text()).get("clusters") or []
    if clusters:
        server = clusters[0]["cluster"]["server"]
    # The one 2-CPU node runs a few jobs at a time, beside pods earlier tests left ending:
    # a job may wait for CPU (unschedulable) past the tier's 4 s start grace, and its
    # waiter would fail it. That is the node's wait, not a fault under test.
    monkeypatch.setenv("KINETIC_GKE_START_GRACE", "240")
    with proxies(gke.emulator, server, NONE, NONE, tmp_path) as (storage, api):
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", storage.url)
        monkeypatch.setenv(
            "KUBECONFIG", str(proxied_kubeconfig(kubeconfig, api.url, tmp_path / "kubeconfig"))
        )
        try:
            yield Faulty(gke=gke, storage=storage, api=api)
        finally:
            # The sync facade's loop keeps its Kubernetes clients, which would go on
            # talking to this test's proxies, gone after it.
            portal.call(runtime.aclose_backends)


async def until_started(jobs: Sequence[JobHandle], seconds: float = 120.0) -> None:
    """Return once no job is PENDING (each runs or has ended); fail the test after
    ``seconds``."""
    with anyio.move_on_after(seconds):
        while True:  # a poll of the jobs' own status, as a user would (no event here)
            if JobStatus.PENDING not in [await job.status() for job in jobs]:
                return
            await anyio.sleep(0.5)
    pytest.fail(f"the jobs did not all start within {seconds:.0f} s")


@dataclass
class Waited:
    """The values the waiters of :func:`waiting_for` got (by position) and when."""

    values: dict[int, Any] = field(default_factory=dict)
    arrived: dict[int, float] = field(default_factory=dict)


@asynccontextmanager
async def waiting_for(jobs: Sequence[JobHandle], timeout: float = 180.0) -> AsyncIterator[Waited]:
    """Await each job's result (kept: ``cleanup=False``) in a task of its own; enter once
    every job has started (:func:`until_started`), so that inside, the waiters' watch is
    open while the jobs run. Leaves once every value has arrived."""
    waited = Waited()

    async def wait(i: int) -> None:
        waited.values[i] = await jobs[i].result(timeout=timeout, cleanup=False)
        waited.arrived[i] = time.monotonic()

    async with anyio.create_task_group() as tg:
        for i in range(len(jobs)):
            tg.start_soon(wait, i)
        await until_started(jobs)
        yield waited
