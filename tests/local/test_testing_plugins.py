"""``kinetic.testing`` under each async test plugin a user may run: pytest-asyncio in
its strict and auto modes, and anyio's plugin.

Each is a user's test module in a pytest process of its own (its own rootdir and
ini file, warnings as errors), so the plugins and modes never meet this suite's
configuration (which runs on anyio's plugin, with ``-p no:asyncio``). Every module
awaits a real job on the local backend inside the plugin's event loop, submits one
from an async fixture, and calls the blocking API from a plain test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.local, pytest.mark.timeout(300)]

_JOB = """
import asyncio

import pytest

import kinetic


@kinetic.run()
def double(x):
    return 2 * x


def test_blocking_call(kinetic_local):
    assert double(5) == 10


def test_the_plugin_is_as_configured(request):
    assert request.config.pluginmanager.has_plugin("asyncio") is {asyncio_loaded}
"""

STRICT = (
    _JOB
    + """
import pytest_asyncio


@pytest_asyncio.fixture
async def submitted(kinetic_local):
    job = await double.aio.run_async(21)
    yield job


@pytest.mark.asyncio
async def test_awaits_a_job(kinetic_local):
    asyncio.get_running_loop()  # pytest-asyncio's loop runs the test
    assert await double.aio(4) == 8


@pytest.mark.asyncio
async def test_an_async_fixture_submits(submitted):
    assert await submitted.result() == 42


@pytest.mark.anyio
async def test_anyio_marked_tests_still_run_beside_it(kinetic_local):
    assert await double.aio(1) == 2
"""
)

AUTO = (
    _JOB
    + """
@pytest.fixture
async def submitted(kinetic_local):
    job = await double.aio.run_async(21)
    yield job


async def test_awaits_a_job(kinetic_local):
    asyncio.get_running_loop()
    assert await double.aio(4) == 8


async def test_an_async_fixture_submits(submitted):
    assert await submitted.result() == 42
"""
)

ANYIO = (
    _JOB
    + """
@pytest.fixture
async def submitted(kinetic_local):
    job = await double.aio.run_async(21)
    yield job


@pytest.mark.anyio
async def test_awaits_a_job(kinetic_local):
    asyncio.get_running_loop()
    assert await double.aio(4) == 8


@pytest.mark.anyio
async def test_an_async_fixture_submits(submitted):
    assert await submitted.result() == 42
"""
)

_INI = """\
[pytest]
filterwarnings = error
{options}
"""


def _run(tmp_path: Path, module: str, options: str, *args: str) -> tuple[int, str]:
    (tmp_path / "test_user.py").write_text(textwrap.dedent(module), encoding="utf-8")
    (tmp_path / "pytest.ini").write_text(_INI.format(options=options), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "kinetic.testing", "-c", "pytest.ini",
         "--rootdir", str(tmp_path), "--basetemp", str(tmp_path / "basetemp"),
         *args, "test_user.py"],
        cwd=tmp_path,
        env={**os.environ, "KINETIC_PROJECT": "somebody-elses-project"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )  # fmt: skip
    return proc.returncode, proc.stdout[-6000:] + proc.stderr[-4000:]


@pytest.mark.parametrize(
    ("module", "options", "passed"),
    [
        pytest.param(
            STRICT.format(asyncio_loaded=True),
            "asyncio_mode = strict\nasyncio_default_fixture_loop_scope = function",
            5,
            id="pytest-asyncio-strict",
        ),
        pytest.param(
            AUTO.format(asyncio_loaded=True),
            "asyncio_mode = auto\nasyncio_default_fixture_loop_scope = function",
            4,
            id="pytest-asyncio-auto",
        ),
    ],
)
def test_under_pytest_asyncio(tmp_path: Path, module: str, options: str, passed: int) -> None:
    code, output = _run(tmp_path, module, options)
    assert code == 0, output
    assert f"{passed} passed" in output, output


def test_under_anyios_plugin(tmp_path: Path) -> None:
    code, output = _run(tmp_path, ANYIO.format(asyncio_loaded=False), "", "-p", "no:asyncio")
    assert code == 0, output
    assert "4 passed" in output, output
