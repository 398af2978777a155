"""The kube-apiserver restarted and no longer holds the watch's resourceVersion: the
waiters re-list, and nothing is missed.

A real apiserver that restarted (its watch cache rebuilt, etcd compacted meanwhile)
answers a watch that resumes from a version it no longer holds with ``410 Gone``: an
HTTP 410, or, once the watch is open, an ``ERROR`` event carrying the 410 status. The
shared testbed's apiserver must keep running, so the API fault proxy
(:meth:`tests.faultproxy.FaultProxy.forget_history`) stands in: it drops every
connection, and answers a resume from before with a 410 (the jobs watch: HTTP 410; the
pods watch: the ``ERROR`` event), never forwarding it, so the events of the gap are never
replayed: only a re-list (``kinetic/_backends/gke/watch.py``) sees the jobs end.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import kinetic
from kinetic._backends.gke.watch import SharedWatch
from kinetic._engine import runtime
from tests.fix_faults import Faulty, slow_triple, waiting_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


async def current_version(watch: SharedWatch) -> int:
    """The apiserver's resourceVersion now, as a list of the watch's pods reads it."""
    listing = await watch.client.list_objects("pods", watch.namespace, watch.selector)
    return int(listing["metadata"]["resourceVersion"])


def test_waiters_re_list_when_the_apiserver_forgot_their_resource_version(
    faulty: Faulty,
) -> None:
    n = 3
    fn = kinetic.run(**faulty.gke.run_args())(slow_triple)
    seen: dict[str, Any] = {}

    async def main() -> None:
        backend = faulty.gke.backend()
        try:
            jobs = [await fn.aio.run_async(4.0 + 0.2 * i) for i in range(n)]
            async with waiting_for(jobs) as waited:  # the waiters' watch is open
                watch = backend.cluster.watch(faulty.gke.namespace)
                # The apiserver's version now (a list reads the latest): every version
                # the watch holds is at most this one, and is forgotten, once the
                # cluster has moved past it (its leases renew every few seconds): the
                # version a re-list gets is then newer, as after a real restart.
                held = await current_version(watch)
                for _ in range(300):
                    if await current_version(watch) > held:
                        break
                    await anyio.sleep(0.2)
                else:
                    pytest.fail(f"the apiserver stayed at version {held} for 60 s")
                seen["lists_before"] = watch.lists
                faulty.api.forget_history(held, as_event={"pods"})
            seen["lists_after"] = watch.lists
            seen["values"] = waited.values
            for job in jobs:
                await job.cleanup()
        finally:
            await runtime.aclose_backends()

    anyio.run(main)
    counts = faulty.api.counts
    assert seen["values"] == {i: 3 * (4.0 + 0.2 * i) for i in range(n)}  # nothing missed
    # Each watch met the 410 once, in its form, and re-listed rather than retry the
    # version it had lost.
    assert counts["gone-status"] == 1, counts
    assert counts["gone-event"] == 1, counts
    assert seen["lists_after"] >= seen["lists_before"] + 2
