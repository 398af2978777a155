"""A runner older than the Kinetic that submitted a job refuses what it cannot honour:
a spec key it does not know fails the job in phase ``fetch``, naming the key and the
fix, instead of running the job without it (a stale prebuilt base would skip its
``# kn:keep`` lines and say nothing)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from kinetic._core.records import job_spec
from runner import protocol
from runner._main import run_job
from runner.store import FileStore

pytestmark = pytest.mark.local


def double(x: int) -> int:
    return 2 * x


def submit(store: FileStore, job_id: str, **extra: Any) -> None:
    payload = cloudpickle.dumps({"fn": double, "args": (21,), "kwargs": {}})
    spec: dict[str, Any] = dict(
        job_spec(
            job_id=job_id,
            func_name="double",
            payload_sha256=hashlib.sha256(payload).hexdigest(),
            context_sha256="0" * 64,
            cwd=None,
            sys_path=[],
            env={},
            output_dir=str(store.root / "out"),
            has_data=False,
        )
    )
    spec.update(context_key=None, context_sha256=None, **extra)  # no project files
    store.write(protocol.payload_key(job_id), payload)
    store.write(protocol.spec_key(job_id), protocol.dump_json(spec))


def test_a_spec_key_this_runner_does_not_know_fails_the_job_in_phase_fetch(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path / "store")
    submit(store, "job-0000new1", install_later=["tabulate==0.9.0"])
    assert run_job(store, "job-0000new1", workdir=tmp_path / "w1") == protocol.EXIT_RUNNER_ERROR
    final = protocol.load_json(store.read(protocol.final_key("job-0000new1")))
    assert final["state"] == "failed"
    assert final["phase"] == "fetch"
    assert "install_later" in final["error"]
    assert "kinetic build-image --rebuild" in final["error"]


def test_the_same_job_without_the_unknown_key_runs(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    submit(store, "job-0000same")
    assert run_job(store, "job-0000same", workdir=tmp_path / "w2") == protocol.EXIT_OK
    final = protocol.load_json(store.read(protocol.final_key("job-0000same")))
    assert final["state"] == "succeeded"


def test_every_key_the_client_can_write_is_known_to_the_runner() -> None:
    spec = job_spec(
        job_id="job-1",
        func_name="f",
        payload_sha256="a" * 64,
        context_sha256="b" * 64,
        cwd="sub",
        sys_path=[""],
        env={"K": "V"},
        output_dir="/out",
        has_data=True,
        install=["numpy==2.0"],
        install_kept=["jaxlib==0.4.30"],
    )
    assert spec["python"] == protocol.python_version()  # where its payload's code loads
    assert protocol.check_spec(dict(spec, debug={"wait": 1.0, "source_root": "/src"})) == {
        **spec,
        "debug": {"wait": 1.0, "source_root": "/src"},
    }


class _Planted:
    """A payload whose unpickling creates ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        import os

        return (os.mkdir, (str(self.path),))


@pytest.mark.parametrize("other", ["3.12", "3.10", "3.13"])
def test_a_payload_of_another_python_fails_in_phase_fetch_unloaded(
    tmp_path: Path, other: str
) -> None:
    """cloudpickle does not carry code across Python minor versions (3.12's code loaded by
    3.11 crashed the interpreter): the runner refuses such a payload before it unpickles
    any of it, naming both versions and the fix."""
    here = protocol.python_version()
    if other == here:
        other = "3.99"
    store = FileStore(tmp_path / "store")
    submit(store, "job-00000f0e", python=other)
    planted = tmp_path / "planted"
    payload = cloudpickle.dumps({"fn": _Planted(planted), "args": (), "kwargs": {}})
    store.write(protocol.payload_key("job-00000f0e"), payload)
    spec = protocol.load_json(store.read(protocol.spec_key("job-00000f0e")))
    spec["payload_sha256"] = hashlib.sha256(payload).hexdigest()
    store.write(protocol.spec_key("job-00000f0e"), protocol.dump_json(spec))
    assert run_job(store, "job-00000f0e", workdir=tmp_path / "w") == protocol.EXIT_RUNNER_ERROR
    final = protocol.load_json(store.read(protocol.final_key("job-00000f0e")))
    assert final["phase"] == "fetch"
    assert f"submitted from Python {other}" in final["error"]
    assert f"this runner is Python {here}" in final["error"]
    assert f"an image with Python {other}" in final["error"]
    assert not planted.exists()
