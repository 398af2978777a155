"""The caller's loop never waits on Kinetic on the GKE backend either (the testbed).

The guard of :mod:`tests.local.test_loop_stalls` (asyncio debug mode,
``slow_callback_duration = 0.02``, slow steps that name a Kinetic frame and were not
preempted) watches 20 concurrent ``backend="gke"`` jobs, their results, status, logs,
attach, list_jobs, cancel and a small batch, beside a 5 ms heartbeat.
"""

from __future__ import annotations

import time

import anyio
import pytest

import kinetic
from kinetic import aio
from tests.fix_cluster import GKETarget
from tests.local.test_loop_stalls import Heartbeat, LoopStallGuard

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def triple(x: int) -> int:
    print(f"tripling {x}", flush=True)
    return 3 * x


def sizes(items: list[int], blob: bytes) -> tuple[int, int]:
    return len(items), len(blob)


def sleeper(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


async def test_gke_jobs_never_stall_the_loop(
    gke: GKETarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The testbed's one node runs a few pods at a time: the others wait for it, queued.
    monkeypatch.setenv("KINETIC_GKE_START_GRACE", "240")
    fn = aio.run(**gke.run_args())(triple)
    where = {"project": gke.project, "cluster": gke.cluster, "backend": "gke"}
    assert await (await fn.run_async(0)).result(timeout=120) == 0  # warm: image, clients
    items, blob = list(range(400_000)), b"x" * (8 << 20)  # built here, not in a guarded step
    beat = Heartbeat()
    async with anyio.create_task_group() as tg:
        tg.start_soon(beat.run)
        with LoopStallGuard() as g:
            handles: list[aio.JobHandle] = []

            async def submit(i: int) -> None:
                handles.append(await fn.run_async(i))

            async with anyio.create_task_group() as submits:
                for i in range(20):
                    submits.start_soon(submit, i)
            # Large arguments: walked, pickled and hashed off the loop.
            big = await aio.run(**gke.run_args())(sizes).run_async(items, blob)
            values: list[int] = []

            async def collect(h: aio.JobHandle) -> None:
                values.append(await h.result(timeout=180, cleanup=False))

            async with anyio.create_task_group() as results:
                for h in handles:
                    results.start_soon(collect, h)
            for h in handles[:3]:
                assert await h.status() is aio.JobStatus.SUCCEEDED
                assert "tripling" in str(await h.logs())
                assert (await aio.attach(h.job_id, **where)).job_id == h.job_id
            listed = await aio.list_jobs(namespace=gke.namespace, **where)
            assert {h.job_id for h in handles} <= {h.job_id for h in listed}
            sleeping = await aio.run(**gke.run_args())(sleeper).run_async(120)
            await sleeping.cancel()
            with pytest.raises((kinetic.JobCancelledError, kinetic.JobFailedError)):
                await sleeping.result(timeout=120)
            batch = await fn.run_async_map(range(10))
            assert sorted(await batch.results(timeout=180)) == [3 * i for i in range(10)]
            for h in handles:
                await h.cleanup()
            assert await big.result(timeout=180) == (400_000, 8 << 20)
        tg.cancel_scope.cancel()
    assert sorted(values) == [3 * i for i in range(20)]
    assert not g.stalls, g.report()
