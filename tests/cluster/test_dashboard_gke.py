"""The dashboard on the cluster tier: a GKE batch (a worker pool on the testbed, its
records in fake-gcs-server) and a single GKE job, read by the dashboard through the
GKE backend and shown in headless Chromium (tests/cdp.py)."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import anyio
import pytest

import kinetic
from kinetic._dashboard import serve
from tests.cdp import ARTIFACTS, launch
from tests.fix_cluster import GKETarget

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def square_or_fail(x: int) -> int:
    print(f"input {x}", flush=True)
    if x == 4:
        raise ValueError("bad input 4")
    return x * x


def talk(n: int) -> int:
    for i in range(n):
        print(f"line {i}", flush=True)
        time.sleep(0.5)
    return n


async def test_a_gke_batch_and_job_in_the_dashboard(gke: GKETarget, tmp_path: Path) -> None:
    batch = await kinetic.aio.run(**gke.run_args())(square_or_fail).run_async_map(range(8))
    job = await kinetic.aio.run(**gke.run_args())(talk).run_async(16)
    where = partial(
        serve, backend="gke", project=gke.project, cluster=gke.cluster, namespace=gke.namespace
    )
    async with anyio.create_task_group() as tg:
        dash = await tg.start(where)
        assert dash.storage_url.startswith("gs://")
        base = f"http://127.0.0.1:{dash.port}"
        async with launch(tmp_path / "chromium") as browser:
            page = await browser.new_page()
            await page.goto(f"{base}/batches/{batch.group_id}?t={dash.token}")
            await page.wait_for(
                "document.getElementById('percent').textContent === '100.0%'", timeout=240
            )
            key = "document.querySelector('.group[data-key=\"ValueError\"] .group-count')"
            assert await page.wait_for(f"!!{key} && {key}.textContent") == "1"
            await page.screenshot(ARTIFACTS / "gke-batch.png")

            await page.goto(f"{base}/batches/{batch.group_id}/inputs/4?t={dash.token}")
            await page.wait_for(
                "document.getElementById('log').textContent.includes('bad input 4')", timeout=60
            )

            await page.goto(f"{base}/jobs/{job.job_id}?t={dash.token}")
            try:
                await page.wait_for(
                    "document.getElementById('live').textContent === 'ended: SUCCEEDED'",
                    timeout=240,
                )
            except TimeoutError:
                raise AssertionError(await page.eval("document.body.innerText")) from None
            assert "line 15" in await page.eval("document.getElementById('log').textContent")
            assert await page.eval("document.getElementById('result-type').textContent") == "int"
            await page.screenshot(ARTIFACTS / "gke-job.png")
        tg.cancel_scope.cancel()
