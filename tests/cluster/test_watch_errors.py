"""A shared watch's subscriber that fails gets its own error, not an ``ExceptionGroup``
(the subscription's task group runs the watch's streams beside the subscriber's body:
``kinetic/_backends/gke/watch.py``, ``subscribe``), and the other subscribers keep a
running watch. Real streams, against the testbed's kube-apiserver."""

from __future__ import annotations

import anyio
import pytest

from kinetic._backends.gke.client import KubeClient
from kinetic._backends.gke.watch import SharedWatch
from kinetic._exceptions import BackendError
from tests import fix_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


@pytest.mark.anyio
async def test_a_failing_subscriber_gets_its_own_error_and_the_others_keep_the_watch(
    testbed: fix_cluster.Testbed,
) -> None:
    client = KubeClient(kubeconfig=testbed.env["KUBECONFIG"])
    watch = SharedWatch(client, testbed.env["KINETIC_TESTBED_NAMESPACE"], "app=kinetic")
    first_drives, first_left = anyio.Event(), anyio.Event()
    caught: list[BaseException] = []

    async def first() -> None:
        try:
            async with watch.subscribe():  # first in: its task group drives the streams
                while not watch.synced:
                    await watch.changed(watch.version)
                first_drives.set()
                raise BackendError("the first subscriber's own error")
        except BaseException as exc:  # noqa: BLE001 - what it raised is the point
            caught.append(exc)
        finally:
            first_left.set()

    async def second() -> None:
        await first_drives.wait()
        async with watch.subscribe():
            connects = watch.connects
            await first_left.wait()
            # The driver passed to this subscriber's candidate, which resumes the streams.
            for _ in range(1000):  # polled: a reconnection is not an event of the copy
                if watch.connects > connects:
                    break
                await anyio.sleep(0.05)
            assert watch.connects > connects
            assert watch.synced

    try:
        with anyio.fail_after(60):  # a bound on a hang, not a timing claim
            async with anyio.create_task_group() as tg:
                tg.start_soon(first)
                tg.start_soon(second)
    finally:
        with anyio.CancelScope(shield=True):
            await client.aclose()
    assert len(caught) == 1
    assert type(caught[0]) is BackendError, repr(caught[0])
    assert str(caught[0]) == "the first subscriber's own error"
