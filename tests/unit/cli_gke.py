"""The CLI's Container API on loopback: ``FakeGKE`` (tests/unit/test_infra_gke_rest.py,
the API's wire format; it has no emulator) served on a thread of its own, since the CLI
runs its own loops, with the project-wide listing ``GET .../locations/-/clusters``
added; ``kinetic``'s session (``infra._Session``) is pointed at it with a fixed token.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from kinetic._cli import infra
from kinetic._infra import gke_api
from kinetic._infra.container import ContainerClient
from tests.loopback_http import Request, reply, serve_in_thread
from tests.unit.test_infra_gke_rest import FakeGKE


class FakeProjectGKE(FakeGKE):
    """``FakeGKE`` of project ``p``, whose clusters may sit in other locations."""

    async def handle(self, request: Request) -> web.Response:
        if re.fullmatch(r"/v1/projects/p/locations/-/clusters", request.url.path):
            self.requests.append(request)
            if self.faults:
                return self.faults.pop(0)
            return reply(200, json={"clusters": list(self.clusters.values())})
        return await super().handle(request)

    def add_cluster(self, name: str, location: str = "z", pools: tuple[Any, ...] = ()) -> None:
        """A running cluster (in ``location``) with ``pools`` (accelerator names, or
        ``NodePool`` bodies), beside the default CPU pool."""
        bodies = [gke_api.node_pool(p) if isinstance(p, str) else p for p in pools]
        default = {"name": "default-pool", "config": {"machineType": "e2-standard-4"}}
        self.clusters[name] = {
            "name": name,
            "status": "RUNNING",
            "location": location,
            "endpoint": "10.0.0.1",
            "nodePools": [default, *bodies],
        }


@pytest.fixture
def gke(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeProjectGKE]:
    """A fake Container API that ``kinetic``'s commands reach, with a fixed token."""
    fake = FakeProjectGKE(polls=1)

    async def token(self: Any) -> str:
        return "t0ken"

    async def container(self: Any) -> ContainerClient:
        client = ContainerClient(
            self.token,
            project=self.target.settings.project,
            location=self.target.settings.zone,
            base_url=url,
            backoff=0.001,
            poll_interval=0.001,
        )
        self._stack.push_async_callback(client.aclose)
        return client

    monkeypatch.setattr(infra._Session, "token", token)
    monkeypatch.setattr(infra._Session, "container", container)
    with serve_in_thread(fake.handle) as server:
        url = server.url
        yield fake
