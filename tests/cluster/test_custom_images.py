"""Custom images that do not carry Kinetic, on the real testbed, from two client Pythons.

An image made for the original Kinetic has Python (and cloudpickle), not Kinetic: the
runner is delivered with the job (:mod:`kinetic._core.runner_delivery`). The testbed's
images are built from Debian's packages: ``local/debian-py:bookworm`` (python3 3.11
only) and ``local/debian-py:trixie`` (python3 3.13 and Debian's cloudpickle). The
tier's own interpreter (3.11) submits to both, and a Python 3.13 client (tox's py313
environment, or one made here) submits to the 3.13 image: its runner image is built
for 3.13.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import kinetic
from tests.fix_cluster import GKETarget

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

ROOT = Path(__file__).parents[2]
PAUSE_IMAGE = "local/pause:3.4.1"
"""On the testbed's node: one static binary, no Python at all."""


def where_am_i() -> dict[str, object]:
    import importlib.util
    import sys

    return {
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "executable": sys.executable,
        "kinetic_installed": importlib.util.find_spec("kinetic._engine") is not None
        and "/opt/kinetic-runner/" not in (importlib.util.find_spec("kinetic").origin or ""),
    }


@pytest.fixture
def delivering(gke: GKETarget, monkeypatch: pytest.MonkeyPatch) -> GKETarget:
    """Jobs whose runner image goes to the testbed's registry (the gke fixture's), built
    there by the Docker builder when new."""
    monkeypatch.setenv("KINETIC_BUILDER", "docker")
    return gke


def test_an_image_with_only_python3_runs_a_job(delivering: GKETarget) -> None:
    image = delivering.testbed.env["KINETIC_TESTBED_BASE_IMAGE"]  # no Kinetic, no cloudpickle
    remote = kinetic.run(**delivering.run_args(container_image=image))(where_am_i)
    job = remote.run_async()
    assert job.image_uri == image
    got = job.result(timeout=300)
    assert got["python"] == "3.11"
    assert got["executable"].startswith("/usr/bin/python3")  # the image's, not a venv's
    assert got["kinetic_installed"] is False


def test_an_image_without_python3_fails_in_phase_fetch(delivering: GKETarget) -> None:
    remote = kinetic.run(**delivering.run_args(container_image=PAUSE_IMAGE))(where_am_i)
    with pytest.raises(kinetic.JobFailedError) as info:
        remote()
    assert info.value.phase == "fetch"
    assert PAUSE_IMAGE in str(info.value)
    assert "`python3`" in str(info.value)


def test_an_image_of_another_python_fails_in_phase_fetch_naming_both(
    delivering: GKETarget,
) -> None:
    image = delivering.testbed.env["KINETIC_TESTBED_PY313_IMAGE"]
    remote = kinetic.run(**delivering.run_args(container_image=image))(where_am_i)
    with pytest.raises(kinetic.JobFailedError) as info:
        remote()
    assert info.value.phase == "fetch"
    message = str(info.value)
    assert "Python 3.11" in message
    assert "Python 3.13" in message


def python313() -> str:
    """An interpreter of Python 3.13 that imports this checkout's Kinetic."""
    tox = ROOT / ".tox" / "py313" / "bin" / "python"
    if tox.exists():
        return str(tox)
    venv = ROOT / ".tox" / "cluster-client-py313"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run(["python3.13", "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-e", str(ROOT)], check=True)
    return str(python)


CLIENT = """\
import json, sys
import kinetic


def where_am_i():
    import sys

    return {"python": f"{sys.version_info.major}.{sys.version_info.minor}"}


remote = kinetic.run(**json.loads(sys.argv[1]))(where_am_i)
print("RESULT " + json.dumps(remote()))
"""


def test_a_python_313_client_runs_in_an_image_of_its_own_python(
    delivering: GKETarget, tmp_path: Path
) -> None:
    image = delivering.testbed.env["KINETIC_TESTBED_PY313_IMAGE"]
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    env = {
        **os.environ,
        "KINETIC_IMAGE_BASE": image,  # the 3.13 runner image is built on it
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(
        [python313(), str(script), json.dumps(delivering.run_args(container_image=image))],
        env=env,
        cwd=tmp_path,
        check=False,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    got = json.loads(line.removeprefix("RESULT "))
    assert got["python"] == "3.13"
