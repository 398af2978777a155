"""Kinetic's messages around real local jobs: the local-backend notice reaches a plain
script on stderr as before, an application's own logging (and nothing else), and
``KINETIC_LOG_LEVEL`` / ``KINETIC_QUIET`` silence it, set before or after ``import
kinetic`` (docs/logging.md)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest

import kinetic
from kinetic._engine import submit

pytestmark = pytest.mark.local

_NOTICE = "no GCP project configured; running on the local backend"

_JOB = """
@kinetic.run()
def one():
    return 1

assert one() + one() == 2
print("done")
"""


def run_script(head: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``head`` then two local jobs, in a fresh interpreter; the test's Kinetic variables
    (its local root) with ``env`` on top, without ``KINETIC_QUIET``."""
    environ = {k: v for k, v in os.environ.items() if k != "KINETIC_QUIET"} | env
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(head) + _JOB],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "done\n"
    return out


def double(x: int) -> int:
    return 2 * x


def notices(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if _NOTICE in line]


def test_a_plain_script_sees_the_notice_on_stderr_once() -> None:
    out = run_script("import kinetic\n")
    [line] = notices(out.stderr)
    assert line.startswith(f"kinetic: {_NOTICE} (")
    assert line.endswith("Set KINETIC_PROJECT or pass backend= to choose.")


def test_an_application_that_configures_logging_gets_the_notice_once_its_way() -> None:
    head = """
        import logging
        import kinetic

        logging.basicConfig(format="APP %(levelname)s %(name)s: %(message)s")
    """
    out = run_script(head)
    [line] = notices(out.stderr)  # not printed twice: Kinetic's own line steps aside
    assert line.startswith(f"APP INFO kinetic._engine.submit: {_NOTICE} (")
    assert "kinetic: " not in out.stderr


@pytest.mark.parametrize(
    ("head", "env"),
    [
        ("import kinetic\n", {"KINETIC_LOG_LEVEL": "ERROR"}),
        ("import kinetic\n", {"KINETIC_LOG_LEVEL": "warning"}),
        ("import kinetic\n", {"KINETIC_QUIET": "1"}),
        # Set after the import, as scripts and benchmarks do: read again at submission.
        ("import os\nimport kinetic\nos.environ['KINETIC_LOG_LEVEL'] = 'error'\n", {}),
        ("import os\nimport kinetic\nos.environ['KINETIC_QUIET'] = '1'\n", {}),
        (
            "import logging\nimport kinetic\nlogging.getLogger('kinetic').setLevel('ERROR')\n",
            {},
        ),
    ],
)
def test_the_notice_is_silenced_by_the_level(head: str, env: dict[str, str]) -> None:
    assert run_script(head, **env).stderr == ""


def test_the_level_variable_wins_over_quiet() -> None:
    out = run_script("import kinetic\n", KINETIC_QUIET="1", KINETIC_LOG_LEVEL="info")
    assert len(notices(out.stderr)) == 1


def test_a_host_in_process_receives_the_notice_record_and_nothing_is_printed(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("KINETIC_QUIET")
    monkeypatch.setattr(submit, "_notice_shown", False)  # as in a new process
    caplog.set_level(logging.INFO, logger="kinetic")
    assert kinetic.run()(double)(2) == 4
    [record] = [r for r in caplog.records if _NOTICE in r.getMessage()]
    assert (record.name, record.levelno) == ("kinetic._engine.submit", logging.INFO)
    assert _NOTICE not in capfd.readouterr().err  # pytest's handlers hear it: no own line


def test_the_level_variable_silences_the_notice_in_process(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("KINETIC_QUIET")
    monkeypatch.setenv("KINETIC_LOG_LEVEL", "ERROR")
    monkeypatch.setattr(submit, "_notice_shown", False)
    caplog.set_level(logging.INFO, logger="kinetic")  # undone by the submission's variable
    assert kinetic.run()(double)(3) == 6
    assert not [r for r in caplog.records if _NOTICE in r.getMessage()]
    assert not submit._notice_shown  # not said: a lower level later still hears it
