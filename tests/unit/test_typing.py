"""Handles carry the type of the job's value (issue 39, section 5), and nothing else changes.

Statically: ``mypy --strict`` passes on ``tests/typing/check_handles.py`` (each
``assert_type`` exact, in the blocking and the async API) and flags exactly the lines of
``tests/typing/fail_handles.py`` marked ``# E: <code>``: were ``result()`` typed ``Any``
again, those would pass and this test fail. At run time: a subscripted handle
(``JobHandle[int]``) is the same class, and pickles, compares and prints as before.
"""

from __future__ import annotations

import configparser
import dataclasses
import pickle
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

import kinetic
from kinetic import aio

REPO = Path(__file__).resolve().parents[2]
TYPING = REPO / "tests" / "typing"
CHECK = TYPING / "check_handles.py"
FAIL = TYPING / "fail_handles.py"

_ERROR = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[\w-]+)\]$")
_EXPECTED = re.compile(r"# E: (?P<code>[\w-]+)\s*$")

Errors = dict[str, set[tuple[int, str]]]


@pytest.fixture(scope="module")
def mypy_errors(tmp_path_factory: pytest.TempPathFactory) -> Errors:
    """``(line, error code)`` of each error mypy reports, by file name. Kinetic's own
    modules are read for their types, their errors left to ``tox -e types``."""
    cache = tmp_path_factory.mktemp("mypy-cache")
    files = [str(p.relative_to(REPO)) for p in (CHECK, FAIL)]
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent"]
        + ["--cache-dir", str(cache), "--no-color-output", "--no-pretty", *files],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    # 0: no errors, 1: errors found; anything else is mypy failing to run at all.
    assert done.returncode in (0, 1), done.stdout + done.stderr
    errors: Errors = {p.name: set() for p in (CHECK, FAIL)}
    for line in done.stdout.splitlines():
        m = _ERROR.match(line)
        if m is not None:
            errors.setdefault(Path(m["path"]).name, set()).add((int(m["line"]), m["code"]))
    assert done.returncode == (1 if any(errors.values()) else 0), done.stdout
    return errors


def test_mypy_strict_passes_on_the_typed_handles(mypy_errors: Errors) -> None:
    assert mypy_errors[CHECK.name] == set()
    assert set(mypy_errors) == {CHECK.name, FAIL.name}


def test_mypy_strict_flags_each_mistake_and_nothing_else(mypy_errors: Errors) -> None:
    expected = {
        (number, m["code"])
        for number, line in enumerate(FAIL.read_text().splitlines(), start=1)
        if (m := _EXPECTED.search(line)) is not None
    }
    assert len(expected) >= 10
    assert mypy_errors[FAIL.name] == expected


def test_the_test_extra_pins_the_mypy_of_the_types_env() -> None:
    tox = configparser.ConfigParser()
    tox.read(REPO / "tox.ini")
    pinned = tox["testenv:types"]["deps"].split()
    test_extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["test"]
    mypy = [r for r in test_extra if r.startswith("mypy")]
    assert mypy == [p for p in pinned if p.startswith("mypy")]
    assert mypy[0].startswith("mypy==")


def _fields() -> dict[str, Any]:
    return {
        "job_id": "job-0123456789ab",
        "backend": "local",
        "project": "",
        "cluster_name": "",
        "zone": "",
        "namespace": "default",
        "bucket_name": "/tmp/kinetic-store",
        "k8s_name": "kinetic-job-0123456789ab",
        "image_uri": "",
        "accelerator": "cpu",
        "func_name": "square",
        "display_name": "kinetic-square-job-0123456789ab",
        "created_at": "2026-11-28T00:00:00Z",
    }


@pytest.mark.parametrize("cls", [kinetic.JobHandle, aio.JobHandle])
def test_a_subscripted_handle_is_the_same_plain_data(cls: Any) -> None:
    plain = cls(**_fields())
    typed = cls[int](**_fields())
    rebuilt = cls[int].from_dict({**plain.to_dict(), "from_a_newer_version": 1})
    for h in (typed, rebuilt):
        assert type(h) is cls
        assert isinstance(h, cls)
        assert h == plain
        assert repr(h) == repr(plain)
        assert h.to_dict() == plain.to_dict()
        assert dataclasses.asdict(h) == dataclasses.asdict(plain)
        again = pickle.loads(pickle.dumps(h))
        assert type(again) is cls
        assert again == plain
    assert [f.name for f in dataclasses.fields(cls)] == list(kinetic.JobHandle.field_names())
    assert (
        cls.__parameters__ == aio.BatchHandle.__parameters__ == kinetic.BatchHandle.__parameters__
    )


def test_the_twins_keep_each_other_typed_at_run_time() -> None:
    job = kinetic.JobHandle[int](**_fields())
    assert type(job.aio) is aio.JobHandle
    assert job.aio == aio.JobHandle(**_fields())
    assert kinetic.JobHandle.from_dict(job.aio.to_dict()) == job
    assert kinetic.BatchHandle[int] is not kinetic.BatchHandle
    assert kinetic.BatchHandle[int].__origin__ is kinetic.BatchHandle
