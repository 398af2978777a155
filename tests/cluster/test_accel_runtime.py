"""The accelerator runtime in real images, on the testbed: pods import what was promised.

- ``kinetic build-image --category tpu`` builds the TPU base for real (``jax[tpu]`` with
  its ``libtpu`` from the package index, Keras); a pod from it on the testbed's CPU node
  imports ``jax``, ``keras`` and ``libtpu`` and reports the versions the plan promised.
- A TPU job whose project pins ``jax==X`` is built an image with ``jax[tpu]==X`` (the
  testbed has no TPU node: the job's own pod never starts; a CPU pod in its image
  reports what it holds).
- A conflicting pin fails at submission, naming the line, with nothing built or uploaded.
- Opt-in (``KINETIC_TEST_GPU_IMAGE=1``: gigabytes of CUDA wheels, not run in CI, whose
  GPU coverage is the resolved set of ``tests/local/test_runtime_resolve.py``): the GPU
  base built for real, and a CPU pod in it importing JAX's CUDA plugin and Keras.
- A ``# kn:keep`` line overrides the runtime: ``keras==3.8.0`` kept is installed over
  the runtime's Keras, after the project's lines, instead of being a conflict.
- The runtime (its environment image, the venv with JAX and Keras, and Kinetic's source
  on it) is built once for two projects: each gets a project image on it.
- The Keras and JAX examples run as ``backend="gke"`` CPU jobs in a bundled image, with
  no requirements file: Keras and JAX come from the image.

Images are built once per run (session fixtures) and reused across runs by their
content-addressed tags.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import kinetic
from kinetic._core.accel_runtime import DEFAULTS, image_python
from kinetic._core.image_spec import prebuilt_tag
from kinetic._images import modes, prebuilt, runner_image
from kinetic._images.runtime_resolve import ResolvedRuntime
from tests import fix_cluster
from tests.fix_cluster import GKETarget

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

PINNED_JAX = "0.7.0"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

REPORT_MODULE = """\
import importlib.metadata
import os


def report():
    import jax
    import keras
    import libtpu  # noqa: F401 - importing it is what is being tested

    versions = {
        name: importlib.metadata.version(name) for name in ("jax", "jaxlib", "keras", "libtpu")
    }
    return {
        **versions,
        "KERAS_BACKEND": os.environ.get("KERAS_BACKEND"),
        "keras_backend": keras.backend.backend(),
        "sum": float(jax.numpy.arange(4.0).sum()),
    }


def imports_tabulate_and_jax():
    import jax
    import tabulate

    return tabulate.__version__, jax.__version__


def installed(*names):
    return {name: importlib.metadata.version(name) for name in names}
"""


def load_module(root: Path, name: str, source: str) -> ModuleType:
    """A user's module in project ``root`` (its own package root)."""
    root.mkdir(parents=True, exist_ok=True)
    module_name = f"kt_{name}_{uuid.uuid4().hex[:8]}"
    path = root / f"{module_name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def project(root: Path, requirements: str | None) -> ModuleType:
    root.mkdir(parents=True, exist_ok=True)
    if requirements is not None:
        (root / "requirements.txt").write_text(requirements)
    return load_module(root, "job", REPORT_MODULE)


@pytest.fixture
def bundled(gke: GKETarget, monkeypatch: pytest.MonkeyPatch) -> Callable[..., dict[str, list[str]]]:
    """Bundled mode on the testbed in registry path ``kt{suffix}``; records every build."""
    env = gke.testbed.env
    monkeypatch.setenv("KINETIC_IMAGE_BASE", env["KINETIC_TESTBED_BASE_IMAGE"])
    monkeypatch.setenv("KINETIC_BUILDER", "docker")
    seen: dict[str, list[str]] = {"builds": []}
    build = runner_image.build

    async def counting_build(the_plan: runner_image.BuildPlan, *a: Any, **kw: Any) -> None:
        seen["builds"].append(the_plan.uri)
        await build(the_plan, *a, **kw)

    monkeypatch.setattr(runner_image, "build", counting_build)

    def use(suffix: str = "") -> dict[str, list[str]]:
        monkeypatch.setenv(
            "KINETIC_IMAGE_REGISTRY", f"{env['KINETIC_TESTBED_REGISTRY']}/kt{suffix}"
        )
        return seen

    return use


@pytest.fixture(scope="session")
def tpu_base(testbed: fix_cluster.Testbed) -> tuple[str, ResolvedRuntime]:
    """``base-tpu:{version}``, built for real by ``kinetic build-image`` (once per run;
    an unchanged image from an earlier run is kept), and the runtime it was promised."""
    uri = build_base(testbed, "tpu")
    return uri, prebuilt.default_runtime("tpu", testbed.env["KINETIC_TESTBED_BASE_IMAGE"])


GPU_REPORT_MODULE = """\
import importlib.metadata


def report():
    import jax
    import jax_cuda12_plugin  # noqa: F401 - the CUDA plugin's package, importable without a GPU
    import keras

    names = ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "keras", "nvidia-cudnn-cu12")
    return {name: importlib.metadata.version(name) for name in names} | {
        "keras_backend": keras.backend.backend(),
        "sum": float(jax.numpy.arange(4.0).sum()),
    }
"""


def build_base(testbed: fix_cluster.Testbed, category: str) -> str:
    """``base-{category}:{version}-py{X.Y}``, built by ``kinetic build-image`` (as a user
    would)."""
    env = testbed.env
    repo = f"{env['KINETIC_TESTBED_REGISTRY']}/kt-base"
    cli_env = {
        **os.environ,
        "KINETIC_BUILDER": "docker",
        "KINETIC_IMAGE_BASE": env["KINETIC_TESTBED_BASE_IMAGE"],
        "DOCKER_HOST": env["DOCKER_HOST"],
    }
    proc = subprocess.run(
        [sys.executable, "-m", "kinetic._cli", "build-image", "--repo", repo]
        + ["--category", category, "--yes"],
        capture_output=True,
        text=True,
        timeout=3000,
        env=cli_env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    [uri] = proc.stdout.split()
    python = image_python(env["KINETIC_TESTBED_BASE_IMAGE"])  # bookworm's: 3.11
    assert uri == f"{repo}/base-{category}:{prebuilt_tag(kinetic.__version__, python)}"
    return uri


@pytest.mark.skipif(
    os.environ.get("KINETIC_TEST_GPU_IMAGE") != "1",
    reason="opt-in (KINETIC_TEST_GPU_IMAGE=1): the CUDA image is gigabytes",
)
@pytest.mark.timeout(3600)
def test_the_gpu_base_holds_the_cuda_plugin_and_keras(gke: GKETarget, tmp_path: Path) -> None:
    uri = build_base(gke.testbed, "gpu")
    promised = prebuilt.default_runtime("gpu", gke.testbed.env["KINETIC_TESTBED_BASE_IMAGE"])
    module = load_module(tmp_path / "proj", "gpu", GPU_REPORT_MODULE)
    got = kinetic.run(**gke.run_args(container_image=uri))(module.report)()
    for name in ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "keras"):
        assert got[name] == promised.version(name)
    assert got["nvidia-cudnn-cu12"] == promised.version("nvidia-cudnn-cu12")
    assert got["keras_backend"] == "jax"
    assert got["sum"] == 6.0


def test_the_tpu_base_holds_jax_tpu_libtpu_and_keras(
    gke: GKETarget, tpu_base: tuple[str, ResolvedRuntime], tmp_path: Path
) -> None:
    uri, promised = tpu_base
    module = project(tmp_path / "proj", None)
    # The testbed has a CPU node only: a CPU job in the TPU base's image.
    remote = kinetic.run(**gke.run_args(container_image=uri))(module.report)
    got = remote()
    assert got["jax"] == promised.version("jax") == DEFAULTS["jax"]
    assert got["jaxlib"] == promised.version("jaxlib")
    assert got["keras"] == promised.version("keras") == DEFAULTS["keras"]
    assert got["libtpu"] == promised.version("libtpu")
    assert got["KERAS_BACKEND"] == "jax"
    assert got["keras_backend"] == "jax"
    assert got["sum"] == 6.0


def _hear_notes(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Let Kinetic's notes (INFO records) through: KINETIC_QUIET would set WARNING at
    each submission."""
    monkeypatch.delenv("KINETIC_QUIET", raising=False)
    caplog.set_level(logging.INFO, logger="kinetic")


def _notes(caplog: pytest.LogCaptureFixture) -> str:
    """The notes Kinetic said, one a line."""
    return "\n".join(r.getMessage() for r in caplog.records if r.getMessage().startswith("note: "))


def test_a_tpu_job_pinning_jax_gets_jax_tpu_at_that_version(
    gke: GKETarget,
    bundled: Callable[..., dict[str, list[str]]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bundled()
    monkeypatch.setattr(modes, "_said", set())  # notes are said once per process
    _hear_notes(monkeypatch, caplog)
    module = project(tmp_path / "proj", f"jax=={PINNED_JAX}\n")
    tpu = kinetic.run(**gke.run_args(container_image=None, accelerator="tpu-v5litepod-4"))
    job = tpu(module.report).run_async()
    image = job.image_uri
    job.cancel()  # no TPU node here: its pod would never be scheduled
    err = _notes(caplog)
    assert (
        f"requirements.txt:1: 'jax=={PINNED_JAX}' is installed as 'jax[tpu]=={PINNED_JAX}'" in err
    )
    # What the TPU job's image holds, reported by a CPU pod in it.
    got = kinetic.run(**gke.run_args(container_image=image))(module.report)()
    assert got["jax"] == got["jaxlib"] == PINNED_JAX
    promised = runner_image_runtime(image)
    assert got["libtpu"] == promised.version("libtpu")


def test_a_kept_line_overrides_the_runtime_in_a_step_of_its_own(
    gke: GKETarget,
    bundled: Callable[..., dict[str, list[str]]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bundled()
    monkeypatch.setattr(modes, "_said", set())
    _hear_notes(monkeypatch, caplog)
    # Held to the runtime's pins, keras==3.8.0 would be a conflict with its keras; kept,
    # it is the user's override, installed over it after the project's lines.
    module = project(tmp_path / "proj", "tabulate==0.8.10\nkeras==3.8.0  # kn:keep\n")
    remote = kinetic.run(**gke.run_args(container_image=None))(module.installed)
    job = remote.run_async("keras", "jax", "tabulate")
    assert "/kinetic-runner:" in job.image_uri
    assert job.result(timeout=600) == {
        "keras": "3.8.0",
        "jax": DEFAULTS["jax"],
        "tabulate": "0.8.10",
    }
    err = _notes(caplog)
    assert err.count("requirements.txt:2: 'keras==3.8.0' is marked `# kn:keep`") == 1


def runner_image_runtime(image: str) -> ResolvedRuntime:
    """The runtime a TPU image of :data:`PINNED_JAX` was promised (the cached resolution)."""
    from kinetic._core.accel_runtime import runtime_request
    from kinetic._core.requirements import parse_requirements_txt
    from kinetic._images import runtime_resolve

    request = runtime_request(parse_requirements_txt(f"jax=={PINNED_JAX}\n"), "tpu")
    runtime = runtime_resolve.resolve_runtime(request, "3.11", runner_image.runtime_inputs())
    base, registry = os.environ["KINETIC_IMAGE_BASE"], os.environ["KINETIC_IMAGE_REGISTRY"]
    assert image == runner_image.runtime_plan(registry, base, runtime).uri
    return runtime


@pytest.mark.parametrize("accelerator", ["l4", "tpu-v5litepod-4"])
def test_a_conflicting_pin_fails_at_submission_with_nothing_built_or_uploaded(
    gke: GKETarget,
    bundled: Callable[..., dict[str, list[str]]],
    tmp_path: Path,
    accelerator: str,
) -> None:
    seen = bundled()
    module = project(tmp_path / "proj", f"tabulate\njax=={PINNED_JAX}\njaxlib==0.6.2\n")
    remote = kinetic.run(**gke.run_args(container_image=None, accelerator=accelerator))
    with pytest.raises(kinetic.RuntimeConflictError) as info:
        remote(module.report).run_async()
    message = str(info.value)
    assert f"requirements.txt:2: 'jax=={PINNED_JAX}'" in message
    assert "requirements.txt:3: 'jaxlib==0.6.2'" in message
    assert "linux x86_64, Python 3.11" in message
    assert seen["builds"] == []
    assert gke.object_names() == []


def test_the_runtime_image_is_built_once_for_two_projects(
    gke: GKETarget, bundled: Callable[..., dict[str, list[str]]], tmp_path: Path
) -> None:
    # A registry path of its own: nothing from earlier runs, so every build is counted.
    seen = bundled(f"-{uuid.uuid4().hex[:8]}")
    first = project(tmp_path / "a", "tabulate\n")
    second = project(tmp_path / "b", "tabulate==0.8.10\n")
    jobs = [
        kinetic.run(**gke.run_args(container_image=None))(module.imports_tabulate_and_jax)
        for module in (first, second)
    ]
    handles = [fn.run_async() for fn in jobs]
    envs = [uri for uri in seen["builds"] if "/kinetic-env:" in uri]
    runtimes = [uri for uri in seen["builds"] if "/kinetic-runtime:" in uri]
    projects = [uri for uri in seen["builds"] if "/kinetic-runner:" in uri]
    assert len(envs) == 1  # the runtime's venv: built once, shared
    assert len(runtimes) == 1  # Kinetic's source on it: once, shared
    assert sorted(projects) == sorted(h.image_uri for h in handles)
    assert len(set(projects)) == 2
    results = [h.result(timeout=300) for h in handles]
    assert results[1] == ("0.8.10", DEFAULTS["jax"])
    assert results[0][1] == DEFAULTS["jax"]
    # A changed requirement rebuilds only that project's layer.
    (tmp_path / "a" / "requirements.txt").write_text("tabulate==0.9.0\n")
    seen["builds"].clear()
    job = jobs[0].run_async()
    assert seen["builds"] == [job.image_uri]  # neither the environment nor the runtime
    assert job.result(timeout=300) == ("0.9.0", DEFAULTS["jax"])


def load_example(name: str) -> Any:
    module_name = f"kt_example_{name}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module.train.__wrapped__


def test_the_examples_run_on_gke_in_a_bundled_image_without_requirements(
    gke: GKETarget,
    bundled: Callable[..., dict[str, list[str]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bundled()
    monkeypatch.setenv("KINETIC_PACKAGE_ROOT", str(EXAMPLES))  # no requirements file there
    assert not (EXAMPLES / "requirements.txt").exists()
    keras_job = kinetic.run(**gke.run_args(container_image=None))(load_example("keras_training"))
    jax_job = kinetic.run(**gke.run_args(container_image=None))(load_example("jax_training"))
    handles = [keras_job.run_async(epochs=3), jax_job.run_async(steps=100)]
    assert all("/kinetic-runtime:" in h.image_uri for h in handles)  # the shared runtime
    loss = handles[0].result(timeout=300, cleanup=False)
    assert isinstance(loss, float)
    assert math.isfinite(loss)
    assert "on the jax backend" in (handles[0].logs() or "")
    handles[0].cleanup()
    out: dict[str, Any] = handles[1].result(timeout=300)
    assert out["jax"] == DEFAULTS["jax"]
    assert out["device"] == "cpu"
    assert out["final_loss"] < out["first_loss"] / 10
