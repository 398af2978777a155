"""Pytest plugin: the cluster tier's testbed (real Kubernetes, registry, fake-gcs-server).

Fixtures:

``testbed`` (session)
    runs ``tests/testbed/up`` (idempotent: 0.5 s when already up, ~20 s warm, ~9 min
    on a fresh machine) and reads its ``run/env.json``. With
    ``KINETIC_TESTBED_KUBECONFIG`` set, ``up`` uses that existing cluster instead
    (see tests/testbed/README.md). If the testbed cannot start, the requesting test
    FAILS: this tier never skips.
``runner_image`` (session)
    the runner image, built by Kinetic's own builder
    (:func:`kinetic._images.runner_image.ensure_runner_image`) on the testbed's base
    image and pushed to its registry; unchanged code reuses the pushed tag.
``gke`` (function)
    a :class:`GKETarget`: the settings a test passes to ``kinetic.run(backend="gke",
    ...)``, a fresh bucket ``{project}-kn-{cluster}-jobs`` on the emulator, and the
    environment (kubeconfig, emulator, ``KINETIC_GKE_*`` knobs) set for the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from kinetic._images.runner_image import ensure_runner_image

REPO = Path(__file__).resolve().parent.parent
TESTBED = REPO / "tests" / "testbed"
START_GRACE = "4"
"""Seconds a job may be unable to start before it fails, in this tier."""


def create_bucket(emulator: str, project: str, name: str) -> None:
    """Create bucket ``name`` of ``project`` on the GCS emulator at ``emulator``."""
    req = urllib.request.Request(
        f"{emulator}/storage/v1/b?project={project}",
        data=json.dumps({"name": name}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    urllib.request.urlopen(req, timeout=10).close()


def run_python(code: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (this one's, with ``flags``) from the
    repository, as another process of the user would; fails the test unless it exits 0."""
    out = subprocess.run(
        [sys.executable, *flags, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
        cwd=str(REPO),
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return out


def cache_dir() -> Path:
    return Path(os.environ.get("KINETIC_TESTBED_CACHE") or Path.home() / ".cache/kinetic-testbed")


@dataclass(frozen=True)
class Testbed:
    env: dict[str, str]
    cache: Path

    def pid_of(self, component: str) -> int:
        """The recorded pid of a component the testbed started (checked against its exe)."""
        run = self.cache / "run"
        pid = int((run / f"{component}.pid").read_text().strip())
        exe = (run / f"{component}.exe").read_text().strip()
        if os.path.realpath(f"/proc/{pid}/exe") != os.path.realpath(exe):
            raise RuntimeError(f"pid {pid} is not the testbed's {component}")
        return pid

    def up(self) -> None:
        """Run ``tests/testbed/up`` (restarts whatever component is down)."""
        # Name our cache explicitly: tests run with KINETIC_* variables cleared, and an `up`
        # on another cache would start a second testbed on the same ports.
        env = {**os.environ, "KINETIC_TESTBED_CACHE": str(self.cache)}
        proc = subprocess.run(
            [str(TESTBED / "up")],
            capture_output=True,
            text=True,
            timeout=1500,
            check=False,
            env=env,
        )
        if proc.returncode != 0:
            pytest.fail(f"tests/testbed/up failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


@pytest.fixture(scope="session")
def testbed() -> Testbed:
    """The running testbed (started here when needed). Fails, never skips."""
    bed = Testbed(env={}, cache=cache_dir())
    bed.up()
    env_file = bed.cache / "run" / "env.json"
    try:
        env = json.loads(env_file.read_text())
    except (OSError, ValueError) as exc:
        pytest.fail(f"the testbed wrote no usable {env_file}: {exc}")
    return Testbed(env={k: str(v) for k, v in env.items()}, cache=bed.cache)


@pytest.fixture(scope="session")
def runner_image(testbed: Testbed) -> str:
    """The runner image built by Kinetic's own builder and pushed to the testbed registry."""
    env = testbed.env

    async def build() -> str:
        return await ensure_runner_image(
            env["KINETIC_TESTBED_REGISTRY"],
            env["KINETIC_TESTBED_BASE_IMAGE"],
            docker_host=env["DOCKER_HOST"],
        )

    return anyio.run(build)


@dataclass(frozen=True)
class GKETarget:
    """Where a cluster test's jobs go."""

    project: str
    cluster: str
    namespace: str
    image: str
    bucket: str
    emulator: str
    testbed: Testbed

    def run_args(self, **overrides: Any) -> dict[str, Any]:
        """Arguments for ``kinetic.run`` that target the testbed."""
        args: dict[str, Any] = {
            "backend": "gke",
            "project": self.project,
            "cluster": self.cluster,
            "namespace": self.namespace,
            "container_image": self.image,
            "accelerator": "cpu",
        }
        args.update(overrides)
        return args

    def backend(self) -> Any:
        """This loop's backend object of the jobs ``run_args()`` sends (same cluster
        context, same client), for tests that count its requests. Call it in a loop."""
        from kinetic._engine import runtime
        from kinetic._settings import load_settings

        settings = load_settings(
            backend="gke", project=self.project, cluster=self.cluster, namespace=self.namespace
        )
        return runtime.backend_for_settings(settings)

    def object_names(self, prefix: str = "") -> list[str]:
        """Object names in the bucket under ``prefix``."""
        url = f"{self.emulator}/storage/v1/b/{self.bucket}/o?prefix={prefix}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            return [item["name"] for item in json.loads(resp.read()).get("items", [])]

    def delete_object(self, key: str) -> None:
        quoted = urllib.request.quote(key, safe="")
        req = urllib.request.Request(
            f"{self.emulator}/storage/v1/b/{self.bucket}/o/{quoted}", method="DELETE"
        )
        urllib.request.urlopen(req, timeout=10).close()


def current_context(kubeconfig: str) -> str:
    """The active context of the testbed's kubeconfig."""
    import yaml

    with open(kubeconfig, encoding="utf-8") as f:
        return str(yaml.safe_load(f)["current-context"])


@pytest.fixture
def gke(testbed: Testbed, runner_image: str, monkeypatch: pytest.MonkeyPatch) -> GKETarget:
    """A fresh bucket and the environment for GKE jobs on the testbed."""
    env = testbed.env
    for key in ("KUBECONFIG", "STORAGE_EMULATOR_HOST", "DOCKER_HOST"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("KINETIC_GKE_HOST_NETWORK", env.get("KINETIC_TESTBED_HOST_NETWORK", "false"))
    monkeypatch.setenv("KINETIC_GKE_SERVICE_ACCOUNT", env["KINETIC_TESTBED_SERVICE_ACCOUNT"])
    monkeypatch.setenv("KINETIC_GKE_START_GRACE", START_GRACE)
    # A coordinated pool's coordinator (the default engine): the testbed's one node's
    # pods share this machine's network, and a server of ours listens on loopback only.
    monkeypatch.setenv("KINETIC_GKE_COORDINATOR_HOST", "127.0.0.1")
    # A custom image's pods get Kinetic's runner from the runner image (built here, on
    # the testbed's base and registry: the one `runner_image` pushed).
    monkeypatch.setenv("KINETIC_IMAGE_REGISTRY", env["KINETIC_TESTBED_REGISTRY"])
    monkeypatch.setenv("KINETIC_IMAGE_BASE", env["KINETIC_TESTBED_BASE_IMAGE"])
    # The jobs name a cluster (its bucket) that has no GKE context: they go to the
    # testbed's active context because the tests ask for it outright.
    monkeypatch.setenv("KINETIC_KUBE_CONTEXT", current_context(env["KUBECONFIG"]))
    project, cluster = "kt", f"c{uuid.uuid4().hex[:10]}"
    bucket = f"{project}-kn-{cluster}-jobs"
    emulator = env["STORAGE_EMULATOR_HOST"]
    create_bucket(emulator, project, bucket)
    return GKETarget(
        project=project,
        cluster=cluster,
        namespace=env["KINETIC_TESTBED_NAMESPACE"],
        image=runner_image,
        bucket=bucket,
        emulator=emulator,
        testbed=testbed,
    )
