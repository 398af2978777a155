"""Execution modes on the real testbed: a user's project with its own requirements.

The throwaway project's ``requirements.txt`` names ``tabulate``, a small pure-Python
distribution that is not in the runner image. Bundled mode builds an image holding it
(Kinetic's Docker builder, the testbed's registry), reuses it while the requirements
are unchanged, and builds a new tag when a line changes. Prebuilt mode runs on a base
image pushed by ``kinetic build-image`` and installs the requirement at pod start with
uv, from a package index served on 127.0.0.1 (pods use the host network here).
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import kinetic
from kinetic._core.accel_runtime import image_python
from kinetic._core.image_spec import prebuilt_tag
from kinetic._images import runner_image
from kinetic._images.docker import Registry
from tests.fix_cluster import GKETarget

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

DIST = "tabulate"
PINNED = "0.8.10"

JOB_MODULE = """\
import importlib.metadata


def dist_version(name):
    import tabulate  # noqa: F401 - the import is what is being tested

    return importlib.metadata.version(name)
"""


def make_project(root: Path, requirements: str) -> Callable[..., Any]:
    """A user project at ``root`` (its own package root); returns its job function."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "requirements.txt").write_text(requirements)
    module_name = f"kt_job_{uuid.uuid4().hex[:8]}"
    path = root / f"{module_name}.py"
    path.write_text(JOB_MODULE)
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None
    assert spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    fn: Callable[..., Any] = module.dist_version
    return fn


@pytest.fixture
def builds(gke: GKETarget, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Bundled mode on the testbed; records every registry query and every build."""
    env = gke.testbed.env
    monkeypatch.setenv("KINETIC_IMAGE_REGISTRY", f"{env['KINETIC_TESTBED_REGISTRY']}/kt")
    monkeypatch.setenv("KINETIC_IMAGE_BASE", env["KINETIC_TESTBED_BASE_IMAGE"])
    monkeypatch.setenv("KINETIC_BUILDER", "docker")
    seen: dict[str, list[str]] = {"queries": [], "builds": []}
    has_tag, build = Registry.has_tag, runner_image.build

    async def counting_has_tag(self: Registry, name: str, tag: str, **kw: Any) -> bool:
        seen["queries"].append(f"{name}:{tag}")
        return await has_tag(self, name, tag, **kw)

    async def counting_build(the_plan: runner_image.BuildPlan, *a: Any, **kw: Any) -> None:
        seen["builds"].append(the_plan.uri)
        await build(the_plan, *a, **kw)

    monkeypatch.setattr(Registry, "has_tag", counting_has_tag)
    monkeypatch.setattr(runner_image, "build", counting_build)
    return seen


def fresh_process() -> None:
    """Forget what this process learnt about its registry, as a new process would."""
    runner_image._KNOWN.clear()


def test_bundled_mode_installs_the_projects_requirements(
    gke: GKETarget, builds: dict[str, list[str]], tmp_path: Path
) -> None:
    fn = make_project(tmp_path / "proj", f"{DIST}  # the table printer\n")
    remote = kinetic.run(**gke.run_args(container_image=None))(fn)

    job = remote.run_async(DIST)
    first_uri = job.image_uri
    assert first_uri.startswith(f"{gke.testbed.env['KINETIC_TESTBED_REGISTRY']}/kt/")
    assert isinstance(job.result(timeout=240), str)
    # The CPU runtime's environment and runtime images (unless an earlier run pushed
    # them) and the project's image on them.
    assert len(builds["builds"]) <= 3

    # Unchanged requirements, a new process: no build, one registry request.
    fresh_process()
    builds["queries"].clear()
    builds["builds"].clear()
    job = remote.run_async(DIST)
    assert job.image_uri == first_uri
    assert builds["builds"] == []
    assert len(builds["queries"]) == 1
    assert isinstance(job.result(timeout=120), str)

    # A comment-only edit keeps the tag; a changed line makes a new one.
    (tmp_path / "proj" / "requirements.txt").write_text(f"{DIST}  # reworded comment\n")
    assert remote.run_async(DIST).image_uri == first_uri
    (tmp_path / "proj" / "requirements.txt").write_text(f"{DIST}=={PINNED}\n")
    job = remote.run_async(DIST)
    assert job.image_uri != first_uri
    assert job.result(timeout=240) == PINNED


def test_a_bad_requirement_line_is_a_clear_error_and_writes_nothing(
    gke: GKETarget, builds: dict[str, list[str]], tmp_path: Path
) -> None:
    fn = make_project(tmp_path / "proj", "tabulate\nnumpy>=>1\n")
    remote = kinetic.run(**gke.run_args(container_image=None))(fn)
    with pytest.raises(kinetic.RequirementsError, match=r"requirements.txt line 2.*numpy>=>1"):
        remote.run_async(DIST)
    assert builds["builds"] == []
    assert gke.object_names() == []


def test_a_failing_build_names_its_cause_and_leaves_no_tag(
    gke: GKETarget, builds: dict[str, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A base image without Python: the image's first RUN step fails inside the build.
    monkeypatch.setenv("KINETIC_IMAGE_BASE", "local/pause:3.4.1")
    fn = make_project(tmp_path / "proj", f"{DIST}\n")
    remote = kinetic.run(**gke.run_args(container_image=None))(fn)
    with pytest.raises(kinetic.ImageBuildError, match="docker build of .* failed") as info:
        remote.run_async(DIST)
    assert "python3" in str(info.value)  # the failing step's log tail
    [uri] = builds["builds"]
    fresh_process()
    assert not runner_image_exists(uri)
    assert gke.object_names() == []


def test_a_requirement_without_a_wheel_fails_before_building(
    gke: GKETarget, builds: dict[str, list[str]], tmp_path: Path
) -> None:
    fn = make_project(tmp_path / "proj", "kinetic-test-absent-dist-xyz==1.0\n")
    remote = kinetic.run(**gke.run_args(container_image=None))(fn)
    with pytest.raises(
        kinetic.RuntimeConflictError, match="requirements.txt:1: 'kinetic-test-absent-dist-xyz"
    ):
        remote.run_async(DIST)
    assert builds["builds"] == []
    assert gke.object_names() == []


class _RefusingRegistry(http.server.BaseHTTPRequestHandler):
    """A registry (v2 wire format) that lists nothing and refuses every upload."""

    def _reply(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._reply(200 if self.path == "/v2/" else 404, b"{}")

    do_HEAD = do_GET

    def do_POST(self) -> None:
        self._reply(403, b'{"errors":[{"code":"DENIED","message":"push refused by policy"}]}')

    do_PUT = do_PATCH = do_POST

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def loopback_server() -> Iterator[Callable[..., str]]:
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(handler: Any) -> str:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_registry_refusing_the_push_is_a_clear_error(
    gke: GKETarget,
    builds: dict[str, list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    loopback_server: Callable[..., str],
) -> None:
    monkeypatch.setenv("KINETIC_IMAGE_REGISTRY", f"{loopback_server(_RefusingRegistry)}/kt")
    fn = make_project(tmp_path / "proj", f"{DIST}\n")
    remote = kinetic.run(**gke.run_args(container_image=None))(fn)
    with pytest.raises(kinetic.ImageBuildError, match="docker push of .* failed"):
        remote.run_async(DIST)
    assert gke.object_names() == []


def runner_image_exists(uri: str) -> bool:
    import anyio

    return anyio.run(runner_image.image_exists, uri)


def test_prebuilt_mode_installs_at_pod_start_with_uv(
    gke: GKETarget,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    loopback_server: Callable[..., str],
) -> None:
    env = gke.testbed.env
    repo = f"{env['KINETIC_TESTBED_REGISTRY']}/kt-base"
    cli_env = {
        **os.environ,
        "KINETIC_BUILDER": "docker",
        "KINETIC_IMAGE_BASE": env["KINETIC_TESTBED_BASE_IMAGE"],
        "DOCKER_HOST": env["DOCKER_HOST"],
    }
    proc = subprocess.run(
        [sys.executable, "-m", "kinetic._cli", "build-image", "--repo", repo]
        # --rebuild: the base's tag is Kinetic's version, so one pushed by an earlier
        # build of the same version may hold an older runner (its environment image,
        # the heavy part, is kept).
        + ["--category", "cpu", "--yes", "--rebuild"],
        capture_output=True,
        text=True,
        timeout=540,
        env=cli_env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    tag = prebuilt_tag(kinetic.__version__, image_python(env["KINETIC_TESTBED_BASE_IMAGE"]))
    assert proc.stdout.split() == [f"{repo}/base-cpu:{tag}"]

    # A package index on 127.0.0.1 holding the requirement's wheel (PEP 503 layout).
    index = tmp_path / "index"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
        + ["--dest", str(index / "simple" / DIST), f"{DIST}=={PINNED}"],
        check=True,
        timeout=300,
    )
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(index))
    monkeypatch.setenv("UV_DEFAULT_INDEX", f"http://{loopback_server(handler)}/simple")

    fn = make_project(tmp_path / "proj", f"{DIST}=={PINNED}\n")
    args = gke.run_args(
        container_image="prebuilt", base_image_repo=repo, capture_env_vars=["UV_DEFAULT_INDEX"]
    )
    remote = kinetic.run(**args)(fn)
    job = remote.run_async(DIST)
    assert job.image_uri == f"{repo}/base-cpu:{tag}"  # the client's Python, 3.11 here
    assert job.result(timeout=240) == PINNED

    # A kept line is installed after the others, by a uv run of its own: it wins over
    # the project's line for the same distribution.
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
        + ["--dest", str(index / "simple" / DIST), f"{DIST}==0.9.0"],
        check=True,
        timeout=300,
    )
    (tmp_path / "proj" / "requirements.txt").write_text(
        f"{DIST}==0.9.0\n{DIST}=={PINNED}  # kn:keep\n"
    )
    job = remote.run_async(DIST)
    assert job.result(timeout=240, cleanup=False) == PINNED
    logs = job.logs() or ""
    assert logs.index("installing 1 requirement(s)") < logs.index("marked kn:keep")
    job.cleanup()

    # A requirement the index lacks: named at submission, before any pod starts.
    (tmp_path / "proj" / "requirements.txt").write_text("kinetic-test-absent-dist-xyz==1.0\n")
    with pytest.raises(kinetic.RuntimeConflictError, match="kinetic-test-absent-dist-xyz"):
        remote(DIST)


def test_prebuilt_mode_rejects_what_cannot_install_remotely(gke: GKETarget, tmp_path: Path) -> None:
    fn = make_project(tmp_path / "proj", "-e ./vendored/lib\n")
    remote = kinetic.run(**gke.run_args(container_image="prebuilt", base_image_repo="r"))(fn)
    with pytest.raises(kinetic.RequirementsError, match=r"requirements.txt:1.*-e ./vendored/lib"):
        remote.run_async(DIST)
    assert gke.object_names() == []
