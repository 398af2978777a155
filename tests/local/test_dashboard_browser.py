"""The dashboard in a real browser: headless Chromium, driven over the DevTools protocol
(tests/cdp.py), against `kinetic dashboard` serving a real local batch and job.

Screenshots of each page (jobs, a job, batches, a batch, an input, the confirm step, a
cancelled input) are kept under ``$KINETIC_ARTIFACTS/dashboard/`` (default
``build/artifacts/dashboard/`` in the repository).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

import kinetic
from tests.cdp import ARTIFACTS, launch
from tests.fix_env import module_project

pytestmark = pytest.mark.local


_MODULE = textwrap.dedent(
    """
    import time

    def work(x):
        print(f"input {x} starts", flush=True)
        time.sleep(0.05)
        if x % 10 == 3:
            raise ValueError(f"bad input {x}")
        return x * x

    def talk(n):
        for i in range(n):
            print(f"line {i}", flush=True)
            time.sleep(0.25)
        return {"lines": n}

    def wait(x):
        time.sleep(60)
        return x
    """
)


@pytest.fixture
def dashboard(kinetic_env: Path) -> Iterator[str]:
    """`kinetic dashboard` on a free port; yields the URL it printed (with its token)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kinetic", "dashboard"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url, said = "", []
        for line in proc.stdout:
            said.append(line)
            if line.strip().startswith("http://127.0.0.1:"):
                url = line.strip()
                break
        assert url, f"the dashboard printed no URL: {''.join(said)}"
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def _page(url: str, path: str) -> str:
    base, _, query = url.partition("/?")
    return f"{base}{path}?{query}"


async def test_batch_and_job_pages_in_chromium(
    dashboard: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module_project(tmp_path / "proj", "dash_work", _MODULE, monkeypatch)
    import dash_work  # type: ignore[import-not-found]

    work = kinetic.aio.run()(dash_work.work)
    talk = kinetic.aio.run()(dash_work.talk)
    batch = await work.run_async_map(range(60), max_concurrent=2)

    async with launch(tmp_path / "chromium") as browser:
        page = await browser.new_page()

        # The batch: progress reaches 100%, the failures are grouped with their count.
        await page.goto(_page(dashboard, f"/batches/{batch.group_id}"))
        assert await page.wait_for(
            "document.getElementById('percent').textContent === '100.0%'", timeout=120
        )
        key = "document.querySelector('.group[data-key=\"ValueError\"] .group-count')"
        assert await page.wait_for(f"!!{key} && {key}.textContent") == "6"
        assert await page.eval("document.querySelectorAll('#chart polygon').length") == 4
        traceback = await page.eval("document.querySelector('.group pre').textContent")
        assert "ValueError: bad input 3" in traceback
        await page.screenshot(ARTIFACTS / "batch.png")

        # An input's page, with its log.
        await page.goto(_page(dashboard, f"/batches/{batch.group_id}/inputs/13"))
        await page.wait_for("document.getElementById('log').textContent.includes('bad input 13')")
        assert await page.eval("document.getElementById('state').textContent") == "FAILED"
        await page.screenshot(ARTIFACTS / "input.png")

        # A single job's page: its log grows while it runs, then its result is shown.
        # Started now: the pages before may take longer than it runs on a loaded machine
        # (its log was then whole when its page opened, and never grew).
        job = await talk.run_async(24)
        await page.goto(_page(dashboard, f"/jobs/{job.job_id}"))
        first = await page.wait_for("document.getElementById('log').textContent.length")
        await page.wait_for(f"document.getElementById('log').textContent.length > {first}")
        await page.wait_for(
            "document.getElementById('live').textContent === 'ended: SUCCEEDED'", timeout=60
        )
        assert "line 23" in await page.eval("document.getElementById('log').textContent")
        assert await page.eval("document.getElementById('result-type').textContent") == "dict"
        await page.screenshot(ARTIFACTS / "job.png")

        # The listing, filtered by state.
        await page.goto(_page(dashboard, "/") + "&state=SUCCEEDED")
        rows = await page.eval("document.querySelectorAll('#jobs tbody tr').length")
        assert rows == 1
        await page.screenshot(ARTIFACTS / "jobs.png")

        # The batches listing links the batch.
        await page.goto(_page(dashboard, "/batches"))
        assert batch.group_id in await page.eval("document.getElementById('batches').innerText")
        await page.screenshot(ARTIFACTS / "batches.png")


async def test_cancel_a_batch_from_its_page_after_confirming(
    dashboard: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module_project(tmp_path / "proj", "dash_wait", _MODULE, monkeypatch)
    import dash_wait  # type: ignore[import-not-found]

    batch = await kinetic.aio.run()(dash_wait.wait).run_async_map(range(6), max_concurrent=2)
    async with launch(tmp_path / "chromium") as browser:
        page = await browser.new_page()
        # One input first, from its own page.
        await page.goto(_page(dashboard, f"/batches/{batch.group_id}/inputs/5"))
        await page.eval("document.getElementById('cancel').click()")
        await page.wait_for("!!document.getElementById('confirm')")
        await page.eval("document.getElementById('confirm').click()")
        await page.wait_for(
            "!!document.getElementById('state') && "
            "document.getElementById('state').textContent === 'FAILED'",
            timeout=30,
        )
        assert (await batch.jobs[5].status_report()).cancelled  # type: ignore[union-attr]
        await page.screenshot(ARTIFACTS / "cancelled-input.png")

        # Then the batch.
        await page.goto(_page(dashboard, f"/batches/{batch.group_id}"))
        await page.eval("document.getElementById('cancel').click()")
        await page.wait_for("!!document.getElementById('confirm')")  # the confirm step
        await page.screenshot(ARTIFACTS / "confirm-cancel.png")
        assert (await batch.status_counts()).get("FAILED", 0) == 1  # nothing more cancelled yet
        await page.eval("document.getElementById('confirm').click()")
        await page.wait_for(
            "!!document.getElementById('percent') && "
            "document.getElementById('percent').textContent === '100.0%'",
            timeout=60,
        )
        with anyio.fail_after(30):
            await batch.wait()
        assert (await batch.status_counts()) == {"FAILED": 6}
