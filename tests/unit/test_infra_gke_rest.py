"""The Container API client against a stateful fake served on loopback
(``tests.loopback_http``).

No emulator of the GKE Container API exists; the fake speaks its documented wire
format: clusters and node pools under ``/v1/projects/{p}/locations/{l}``, long calls
answered with an ``Operation`` that is polled at ``operations/{name}`` until
``status`` is ``DONE`` (with ``error`` when it failed), errors as
``{"error": {"code", "message", "status"}}``.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anyio
import pytest
from aiohttp import web

from kinetic._exceptions import BackendError, ConfigError, JobTimeoutError, KineticError
from kinetic._infra import gke_api
from kinetic._infra.container import ContainerClient
from kinetic._infra.ops import ensure_cluster
from tests.loopback_http import BREAK, Request, reply, serve

ROOT = "/v1/projects/p/locations/z"


def error(code: int, status: str, message: str) -> web.Response:
    return reply(code, json={"error": {"code": code, "message": message, "status": status}})


class FakeGKE:
    """Clusters, pools and operations; an operation is DONE after ``polls`` polls."""

    def __init__(self, polls: int = 2) -> None:
        self.clusters: dict[str, dict[str, Any]] = {}
        self.operations: dict[str, dict[str, Any]] = {}
        self.polls_left: dict[str, int] = {}
        self.polls = polls
        self.requests: list[Request] = []
        self.fail_operation: str | None = None
        self.faults: list[web.Response] = []
        """Answers to give instead of the next requests (``BREAK``: a transport fault)."""
        self.hang = False

    def operation(self, kind: str, on_done: Any) -> web.Response:
        name = f"operation-{len(self.operations) + 1}"
        self.operations[name] = {"name": name, "status": "RUNNING", "operationType": kind}
        self.polls_left[name] = self.polls
        self.on_done = getattr(self, "on_done", {})
        self.on_done[name] = on_done
        return reply(200, json=self.operations[name])

    async def handle(self, request: Request) -> web.Response:
        self.requests.append(request)
        if self.hang:
            await anyio.sleep(30)
        if self.faults:
            return self.faults.pop(0)
        path, method = request.url.path, request.method
        assert path.startswith(ROOT), path
        rest = path[len(ROOT) :]
        body = json.loads(request.content) if request.content else None
        if m := re.fullmatch(r"/operations/([\w-]+)", rest):
            op = self.operations.get(m[1])
            if op is None:
                return error(404, "NOT_FOUND", f"no operation {m[1]}")
            self.polls_left[op["name"]] -= 1
            if self.polls_left[op["name"]] <= 0 and op["status"] != "DONE":
                op["status"] = "DONE"
                if self.fail_operation:
                    op["error"] = {"code": 8, "message": self.fail_operation}
                else:
                    self.on_done[op["name"]]()
            return reply(200, json=op)
        if rest == "/clusters" and method == "POST":
            cluster = body["cluster"]
            if cluster["name"] in self.clusters:
                return error(409, "ALREADY_EXISTS", "exists")

            def made() -> None:
                self.clusters[cluster["name"]] = cluster | {
                    "status": "RUNNING",
                    "endpoint": "10.0.0.1",
                    "masterAuth": {"clusterCaCertificate": "Q0E="},
                    "location": "z",
                }

            return self.operation("CREATE_CLUSTER", made)
        if m := re.fullmatch(r"/clusters/([\w-]+)", rest):
            cluster = self.clusters.get(m[1])
            if cluster is None:
                return error(404, "NOT_FOUND", f"Not found: cluster {m[1]}")
            if method == "GET":
                return reply(200, json=cluster)
            return self.operation("DELETE_CLUSTER", lambda: self.clusters.pop(m[1]))
        if m := re.fullmatch(r"/clusters/([\w-]+)/nodePools(?:/([\w-]+))?", rest):
            cluster = self.clusters.get(m[1])
            if cluster is None:
                return error(404, "NOT_FOUND", f"Not found: cluster {m[1]}")
            pools = cluster.setdefault("nodePools", [])
            if method == "GET":
                return reply(200, json={"nodePools": pools})
            if method == "POST":
                pool = body["nodePool"]
                if any(p["name"] == pool["name"] for p in pools):
                    return error(409, "ALREADY_EXISTS", f"node pool {pool['name']} exists")
                return self.operation("CREATE_NODE_POOL", lambda: pools.append(pool))
            if not any(p["name"] == m[2] for p in pools):
                return error(404, "NOT_FOUND", f"Not found: node pool {m[2]}")
            return self.operation(
                "DELETE_NODE_POOL",
                lambda: pools.remove(next(p for p in pools if p["name"] == m[2])),
            )
        return error(400, "INVALID_ARGUMENT", f"unexpected {method} {rest}")


@contextlib.asynccontextmanager
async def client(
    fake: FakeGKE, *, tokens: list[str] | None = None
) -> AsyncIterator[ContainerClient]:
    """A client of ``fake``, served on loopback while the block runs."""
    issued = tokens if tokens is not None else []

    async def token() -> str:
        issued.append(f"tok-{len(issued)}")
        return issued[-1]

    async with (
        serve(fake.handle) as server,
        ContainerClient(
            token,
            project="p",
            location="z",
            base_url=server.url,
            backoff=0.001,
            poll_interval=0.001,
        ) as gke,
    ):
        yield gke


async def test_create_a_cluster_polls_its_operation_to_completion() -> None:
    fake, tokens, seen = FakeGKE(polls=3), [], []
    async with client(fake, tokens=tokens) as gke:
        assert await gke.get_cluster("c") is None
        info = await gke.create_cluster("c", progress=seen.append)
    assert info.name == "c"
    assert info.status == "RUNNING"
    assert info.managed
    assert [p.name for p in info.pools] == ["default-pool"]
    # GET, POST, three polls, GET: each with a token from the source.
    assert [r.method for r in fake.requests] == ["GET", "POST", "GET", "GET", "GET", "GET"]
    assert [r.headers["authorization"] for r in fake.requests] == [f"Bearer {t}" for t in tokens]
    post = fake.requests[1]
    assert post.url.path == f"{ROOT}/clusters"
    assert json.loads(post.content) == gke_api.create_cluster("p", "z", "c").body
    assert len(seen) == 3
    assert "CREATE_CLUSTER operation-1: RUNNING" in seen[0]


async def test_pools_are_added_listed_and_removed() -> None:
    fake = FakeGKE()
    async with client(fake) as gke:
        await gke.create_cluster("c")
        body = gke_api.node_pool("l4", max_nodes=2, spot=True)
        await gke.create_pool("c", body)
        pools = await gke.list_pools("c")
        assert [(p.name, p.spot, p.max_nodes) for p in pools] == [
            ("default-pool", False, 3),
            ("kn-gpu-l4-spot", True, 2),
        ]
        with pytest.raises(ConfigError, match="exists already"):
            await gke.create_pool("c", body)
        assert await gke.delete_pool("c", "kn-gpu-l4-spot")
        assert not await gke.delete_pool("c", "kn-gpu-l4-spot")
        assert [p.name for p in await gke.list_pools("c")] == ["default-pool"]
        with pytest.raises(ConfigError, match="no GKE cluster 'nope'"):
            await gke.list_pools("nope")
        with pytest.raises(ConfigError, match="no GKE cluster"):
            await gke.create_pool("nope", body)
        assert await gke.delete_cluster("c")
        assert not await gke.delete_cluster("c")
        assert await gke.get_cluster("c") is None


async def test_up_creates_the_cluster_and_pool_once() -> None:
    fake = FakeGKE()
    pool = gke_api.node_pool("tpu-v5litepod-4")
    async with client(fake) as gke:
        info, done = await ensure_cluster(gke, "c", pool=pool, timeout=10)
        assert info.managed
        assert [(o.item, o.result) for o in done] == [
            ("GKE cluster c", "created"),
            ("node pool kn-tpu-v5litepod-4", "created"),
        ]
        n = len(fake.requests)
        _, again = await ensure_cluster(gke, "c", pool=pool, timeout=10)
        assert [o.result for o in again] == ["kept", "pre-existing"]
        assert len(fake.requests) == n + 1  # one GET: nothing created twice
    fake.clusters["c"]["resourceLabels"] = {}
    async with client(fake) as gke:
        _, theirs = await ensure_cluster(gke, "c", timeout=10)
    assert [o.result for o in theirs] == ["pre-existing"]


async def test_a_failed_operation_raises_its_message() -> None:
    fake = FakeGKE()
    fake.fail_operation = "Insufficient regional quota to satisfy request: CPUS"
    async with client(fake) as gke:
        with pytest.raises(BackendError, match="CREATE_CLUSTER.*failed: Insufficient regional"):
            await gke.create_cluster("c")


async def test_an_operation_that_does_not_finish_is_bounded() -> None:
    fake = FakeGKE(polls=10**6)
    async with client(fake) as gke:
        with pytest.raises(JobTimeoutError, match="still RUNNING after 0.05s"):
            await gke.create_cluster("c", timeout=0.05)


async def test_transient_faults_are_retried() -> None:
    fake = FakeGKE()
    fake.faults = [
        error(503, "UNAVAILABLE", "try again"),
        BREAK,
        error(400, "FAILED_PRECONDITION", "Cluster is running incompatible operation op-9"),
    ]
    async with client(fake) as gke:
        assert await gke.get_cluster("c") is None
    assert len(fake.requests) == 4


async def test_persistent_faults_become_our_errors() -> None:
    fake = FakeGKE()
    fake.faults = [error(503, "UNAVAILABLE", "down")] * 4
    async with client(fake) as gke:
        with pytest.raises(BackendError, match="get cluster c failed.*503 UNAVAILABLE: down"):
            await gke.get_cluster("c")
    fake.faults = [BREAK] * 4
    async with client(fake) as gke:
        with pytest.raises(BackendError, match="ClientPayloadError") as info:
            await gke.get_cluster("c")
    assert isinstance(info.value.__cause__, aiohttp.ClientPayloadError)


@pytest.mark.parametrize(
    ("answer", "kind", "match"),
    [
        (error(403, "PERMISSION_DENIED", "no"), BackendError, "HTTP 403.*credentials"),
        (error(401, "UNAUTHENTICATED", "who"), BackendError, "application-default login"),
        (error(400, "INVALID_ARGUMENT", "bad machine"), ConfigError, "refused.*bad machine"),
        (error(409, "ALREADY_EXISTS", "taken"), BackendError, "HTTP 409"),
        (reply(418, text="teapot"), BackendError, "HTTP 418"),
    ],
)
async def test_refusals_are_translated(
    answer: web.Response, kind: type[KineticError], match: str
) -> None:
    fake = FakeGKE()
    fake.faults = [answer]
    async with client(fake) as gke:
        with pytest.raises(kind, match=match):
            await gke.get_cluster("c")
    assert len(fake.requests) == 1  # not retried


async def test_a_hung_api_is_bounded() -> None:
    fake = FakeGKE()
    fake.hang = True
    async with client(fake) as gke:
        with pytest.raises(BackendError, match="no answer within 0.05s"):
            await gke._send(gke_api.get_cluster("p", "z", "c"), timeout=0.05)


async def test_a_token_source_failure_is_not_hidden() -> None:
    async def no_token() -> str:
        raise BackendError("no usable Google credentials")

    fake = FakeGKE()
    async with (
        serve(fake.handle) as server,
        ContainerClient(no_token, project="p", location="z", base_url=server.url) as gke,
    ):
        with pytest.raises(BackendError, match="no usable Google credentials"):
            await gke.get_cluster("c")
    assert fake.requests == []


# --------------------------------------------------------------------------- CLI usage


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["pool", "list"], "node pools are GKE's"),
        (["--project", "p", "pool", "list", "--use-kubeconfig"], None),
        (["--project", "p", "up", "--use-kubeconfig", "--accelerator", "l4"], "needs a GKE"),
        (["--project", "p", "pool", "add", "--accelerator", "gpu-nope"], "gpu-nope"),
        (
            [
                "--project",
                "p",
                "pool",
                "add",
                "--accelerator",
                "l4",
                "--min-nodes",
                "2",
                "--max-nodes",
                "1",
            ],
            "node counts",
        ),
        (["--project", "p", "pool", "remove"], "NAME or --accelerator"),
        (["--project", "p", "pool", "remove", "kn-gpu-l4"], "pass --yes"),
        (["--namespace", "Bad_NS", "status", "--use-kubeconfig"], "invalid namespace"),
    ],
)
def test_bad_usage_exits_2_before_any_call(
    argv: list[str], message: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    from kinetic._cli import main

    if message is None:  # `pool` has no --use-kubeconfig: argparse refuses it
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        return
    assert main(argv) == 2
    assert message in capsys.readouterr().err
