"""Execution modes: what the image step costs a submission, and what a build costs.

(a) Dependency discovery + tag, warm (no testbed needed): reading the package root's
    50-line ``requirements.txt``, splitting off the accelerator runtime
    (:func:`kinetic._core.accel_runtime.runtime_request`) and the project image's
    content-addressed tag (:func:`kinetic._images.runner_image.project_plan`), the
    runtime's resolution being cached. Target: <= 5 ms.
(b) The image step of a warm bundled submission (the tag is in the registry):
    :func:`kinetic._images.modes.resolve_job_image` as a new process sees it (one
    registry request) and as a process that already saw the tag (none), side by side
    with custom mode (no image step). Target: <= 1 registry request and <= 30 ms.
(c) A cold build of the test project's image on its CPU runtime image (every layer
    built, ``nocache``) and the rebuild after a one-line change to ``requirements.txt``,
    on the testbed's Docker daemon and registry: the runtime image is never rebuilt.
(e) The runtime per category (``--runtime-builds``; CPU and TPU: the CUDA image is
    gigabytes and is not built here): the environment image's cold build and push
    (``nocache``), a warm rebuild of the same context (every layer from the cache), and
    the build of Kinetic's source layer on it (what a new Kinetic build costs).
(d) Start-up cost per execution mode: the round trip of a blocking no-op job from a
    project whose ``requirements.txt`` names ``tabulate``, interleaved, warm images:
    custom (the runner image, the requirement unused), bundled (an image holding it),
    prebuilt (the base image; the pod installs it with uv from an index on 127.0.0.1).

(b), (c) and (d) need the testbed (``tests/testbed/up``, run by this script with
``--testbed``). Writes ``benchmarks/results/images.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from _common import machine, summary, verdict, write_results

from kinetic._core.accel_runtime import runtime_request
from kinetic._core.config import resolve_settings
from kinetic._core.gke_config import GKEOptions
from kinetic._core.image_spec import execution_mode
from kinetic._core.requirements import _classify, requirements_lines
from kinetic._engine.requirements_io import read_project_requirements
from kinetic._images import modes, prebuilt, runner_image
from kinetic._images.docker import DockerBuilder, DockerEngine, Registry
from kinetic._images.runtime_resolve import ResolvedRuntime
from kinetic._storage.local import LocalStorage

FIFTY = [f"package-{i}>=1.{i},<3  # pinned for reasons {i}" for i in range(48)]
FIFTY += ["jax[tpu]>=0.4", "requests==2.32.3; python_version >= '3.8'"]


def discovery(runs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "requirements.txt").write_text("\n".join(FIFTY) + "\n")
        resolved = ResolvedRuntime("tpu", "3.11", ("jax==0.10.2", "keras==3.15.1"))
        runtime = runner_image.runtime_plan("reg/x", "base", resolved)  # read once per process

        def once() -> float:
            t0 = time.perf_counter()
            request = runtime_request(read_project_requirements(root), "tpu")
            lines = tuple(requirements_lines(request.project))
            runner_image.project_plan(runtime, lines)
            return time.perf_counter() - t0

        unchanged, one_line_edited, first_in_process = [], [], []
        for i in range(runs):
            unchanged.append(once())
            lines = [*FIFTY[:-1], f"requests=={i}.0"]  # one changed line: validated anew
            (root / "requirements.txt").write_text("\n".join(lines) + "\n")
            one_line_edited.append(once())
            _classify.cache_clear()  # a new process: every line validated
            first_in_process.append(once())
    result = {
        "lines": len(FIFTY),
        "unchanged_file": summary(unchanged),
        "one_line_edited": summary(one_line_edited),
        "first_in_process": summary(first_in_process),
    }
    result["verdict_5ms"] = verdict(
        max(v["median_ms"] for k, v in result.items() if isinstance(v, dict)), 5.0
    )
    return result


def _current_context(kubeconfig: str) -> str:
    import yaml

    with open(kubeconfig, encoding="utf-8") as f:
        return str(yaml.safe_load(f)["current-context"])


def testbed_env() -> dict[str, str]:
    subprocess.run([str(REPO / "tests/testbed/up")], check=True, capture_output=True)
    cache = Path(os.environ.get("KINETIC_TESTBED_CACHE") or Path.home() / ".cache/kinetic-testbed")
    return {k: str(v) for k, v in json.loads((cache / "run/env.json").read_text()).items()}


def project(root: Path, requirements: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "requirements.txt").write_text(requirements)
    return root


async def warm_image_step(env: dict[str, str], runs: int) -> dict[str, Any]:
    registry = f"{env['KINETIC_TESTBED_REGISTRY']}/bench"
    base = env["KINETIC_TESTBED_BASE_IMAGE"]
    os.environ["DOCKER_HOST"] = env["DOCKER_HOST"]
    os.environ["KINETIC_BUILDER"] = "docker"
    settings = resolve_settings(env=os.environ, profile=None, home=str(Path.home()))
    options = GKEOptions(image_registry=registry, base_image=base)
    queries = 0
    has_tag = Registry.has_tag

    async def counting(self: Registry, name: str, tag: str, **kw: Any) -> bool:
        nonlocal queries
        queries += 1
        return await has_tag(self, name, tag, **kw)

    Registry.has_tag = counting  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp:
        root = project(Path(tmp) / "proj", "tabulate\n")
        store = LocalStorage(Path(tmp) / "locks")

        async def step(image: str | None) -> Any:
            # As a submission does it (kinetic._engine.submit.job_image): the project's
            # requirements (none read for a custom image), then the image.
            requirements = (
                []
                if execution_mode(image) == "custom"
                else await anyio.to_thread.run_sync(read_project_requirements, root)
            )
            return await modes.resolve_job_image(
                image,
                requirements=requirements,
                category="cpu",
                settings=settings,
                options=options,
                storage=store,
                env=os.environ,
            )

        await step(None)  # builds once if this tag is new
        fresh, warm, custom = [], [], []
        fresh_q, warm_q = [], []
        for _ in range(runs):
            runner_image._KNOWN.clear()
            queries = 0
            t0 = time.perf_counter()
            await step(None)
            fresh.append(time.perf_counter() - t0)
            fresh_q.append(queries)
            queries = 0
            t0 = time.perf_counter()
            await step(None)
            warm.append(time.perf_counter() - t0)
            warm_q.append(queries)
            t0 = time.perf_counter()
            await step("custom/image:1")
            custom.append(time.perf_counter() - t0)
    Registry.has_tag = has_tag  # type: ignore[method-assign]
    out = {
        "new_process": {**summary(fresh), "registry_requests": max(fresh_q)},
        "same_process": {**summary(warm), "registry_requests": max(warm_q)},
        "custom_mode": summary(custom),
    }
    added = out["new_process"]["median_ms"] - out["custom_mode"]["median_ms"]
    out["added_ms_new_process"] = round(added, 3)
    out["verdict"] = (
        "PASS" if added <= 30.0 and out["new_process"]["registry_requests"] <= 1 else "MISS"
    )
    return out


async def builds(env: dict[str, str]) -> dict[str, Any]:
    registry = f"{env['KINETIC_TESTBED_REGISTRY']}/bench-cold"
    base = env["KINETIC_TESTBED_BASE_IMAGE"]
    engine = DockerEngine(env["DOCKER_HOST"])
    resolved = await anyio.to_thread.run_sync(prebuilt.default_runtime, "cpu", base)
    runtime = runner_image.runtime_plan(registry, base, resolved)
    await runner_image.ensure_image(runtime, lambda: DockerBuilder(env["DOCKER_HOST"]))
    first = runner_image.project_plan(runtime, ("tabulate",))
    second = runner_image.project_plan(runtime, ("tabulate==0.8.10",))
    ctx1 = await anyio.to_thread.run_sync(runner_image._context, first)
    ctx2 = await anyio.to_thread.run_sync(runner_image._context, second)
    t0 = time.perf_counter()
    await engine.build(ctx1, first.uri, no_cache=True)
    await engine.push(first.uri)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    log = await engine.build(ctx2, second.uri)
    await engine.push(second.uri)
    rebuild = time.perf_counter() - t0
    steps = re.findall(r"^Step \d+/\d+ : (.*)$", log, re.MULTILINE)
    cached = log.count("Using cache")
    return {
        "cold_project_build_and_push_s": round(cold, 2),
        "rebuild_after_one_line_change_s": round(rebuild, 2),
        "ratio": round(rebuild / cold, 3),
        "rebuild_steps": len(steps),
        "rebuild_steps_from_cache": cached,
        # The project image's build holds no step of the runtime's (its venv is FROM it).
        "runtime_rebuilt": "MISS" if "python3 -m venv" in log else "PASS (never: built FROM it)",
    }


async def runtime_builds(env: dict[str, str], categories: tuple[str, ...]) -> dict[str, Any]:
    registry = f"{env['KINETIC_TESTBED_REGISTRY']}/bench-runtime"
    base = env["KINETIC_TESTBED_BASE_IMAGE"]
    engine = DockerEngine(env["DOCKER_HOST"])
    out: dict[str, Any] = {}
    for category in categories:
        t0 = time.perf_counter()
        resolved = await anyio.to_thread.run_sync(prebuilt.default_runtime, category, base)
        resolve_s = time.perf_counter() - t0
        runtime = runner_image.runtime_plan(registry, base, resolved)
        the_plan = runtime.parent  # the environment image: the runtime's heavy layer
        assert the_plan is not None
        t0 = time.perf_counter()
        context = await anyio.to_thread.run_sync(runner_image._context, the_plan)
        wheels_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        await engine.build(context, the_plan.uri, no_cache=True)
        await engine.push(the_plan.uri)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        await engine.build(context, the_plan.uri)
        await engine.push(the_plan.uri)
        warm = time.perf_counter() - t0
        source = await anyio.to_thread.run_sync(runner_image._context, runtime)
        t0 = time.perf_counter()
        await engine.build(source, runtime.uri, no_cache=True)
        await engine.push(runtime.uri)
        source_s = time.perf_counter() - t0
        out[category] = {
            "resolve_s (cached after the first)": round(resolve_s, 2),
            "wheels_and_context_s": round(wheels_s, 2),
            "context_mb": round(len(context) / 2**20, 1),
            "cold_build_and_push_s": round(cold, 2),
            "warm_build_and_push_s": round(warm, 2),
            "kinetic_source_layer_build_and_push_s": round(source_s, 2),
            "jax": resolved.version("jax"),
            "keras": resolved.version("keras"),
            "libtpu": resolved.version("libtpu"),
        }
    return out


GPU_NOT_BUILT = (
    "the CUDA wheels are gigabytes: the GPU set is resolved (tests/local/"
    "test_runtime_resolve.py), never built, on these machines"
)

NOOP_MODULE = "def noop():\n    return 1\n"


def per_mode_startup(env: dict[str, str], runs: int) -> dict[str, Any]:
    import functools
    import http.server
    import importlib.util
    import threading
    import urllib.request
    import uuid

    import kinetic
    from kinetic._images.prebuilt import build_base_images

    for key in ("KUBECONFIG", "STORAGE_EMULATOR_HOST", "DOCKER_HOST"):
        os.environ[key] = env[key]
    os.environ["KINETIC_GKE_HOST_NETWORK"] = env["KINETIC_TESTBED_HOST_NETWORK"]
    os.environ["KINETIC_GKE_SERVICE_ACCOUNT"] = env["KINETIC_TESTBED_SERVICE_ACCOUNT"]
    # The jobs name a cluster (its bucket) with no GKE context: the testbed's, outright.
    os.environ["KINETIC_KUBE_CONTEXT"] = _current_context(env["KUBECONFIG"])
    os.environ["KINETIC_QUIET"] = "1"
    os.environ["KINETIC_BUILDER"] = "docker"
    os.environ["KINETIC_IMAGE_REGISTRY"] = f"{env['KINETIC_TESTBED_REGISTRY']}/bench"
    os.environ["KINETIC_IMAGE_BASE"] = base = env["KINETIC_TESTBED_BASE_IMAGE"]
    cluster = f"b{uuid.uuid4().hex[:8]}"
    req = urllib.request.Request(
        f"{env['STORAGE_EMULATOR_HOST']}/storage/v1/b?project=kb",
        data=json.dumps({"name": f"kb-kn-{cluster}-jobs"}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    urllib.request.urlopen(req, timeout=10).close()
    repo = f"{env['KINETIC_TESTBED_REGISTRY']}/bench-base"
    custom = anyio.run(runner_image.ensure_runner_image, env["KINETIC_TESTBED_REGISTRY"], base)
    anyio.run(
        functools.partial(
            build_base_images, repo, ["cpu"], tag=kinetic.__version__, base_image=base,
            builder=DockerBuilder(env["DOCKER_HOST"]),
        )
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        index = Path(tmp) / "index"
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
            + ["--dest", str(index / "simple/tabulate"), "tabulate==0.8.10"],
            check=True,
        )
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(index))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        os.environ["UV_DEFAULT_INDEX"] = f"http://127.0.0.1:{server.server_address[1]}/simple"
        root = project(Path(tmp) / "proj", "tabulate==0.8.10\n")
        (root / "bench_noop.py").write_text(NOOP_MODULE)
        spec = importlib.util.spec_from_file_location("bench_noop", root / "bench_noop.py")
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_noop"] = module
        spec.loader.exec_module(module)
        modes_ = {"custom": custom, "bundled": None, "prebuilt": "prebuilt"}
        fns = {
            name: kinetic.run(
                backend="gke", project="kb", cluster=cluster, accelerator="cpu",
                container_image=image, base_image_repo=repo,
                capture_env_vars=["UV_DEFAULT_INDEX"],
            )(module.noop)
            for name, image in modes_.items()
        }  # fmt: skip
        samples: dict[str, list[float]] = {name: [] for name in fns}
        for fn in fns.values():
            fn()  # warm: images built and pulled
        for _ in range(runs):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - t0)
        server.shutdown()
        server.server_close()
    out: dict[str, Any] = {name: summary(xs) for name, xs in samples.items()}
    base_ms = out["custom"]["median_ms"]
    for name in ("bundled", "prebuilt"):
        out[name]["added_vs_custom_ms"] = round(out[name]["median_ms"] - base_ms, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--testbed", action="store_true", help="also (b) and (c) on the testbed")
    ap.add_argument(
        "--runtime-builds", action="store_true", help="only (e): runtime images on the testbed"
    )
    args = ap.parse_args()
    if args.runtime_builds:
        figures = anyio.run(runtime_builds, testbed_env(), ("cpu", "tpu"))
        figures["gpu"] = {"built": False, "why": GPU_NOT_BUILT}
        print("runtime builds:", figures)
        print(f"wrote {write_results('runtime_builds', {'machine': machine(), **figures})}")
        return
    results: dict[str, Any] = {"machine": machine(), "discovery_and_tag": discovery(args.runs)}
    print("discovery + tag (50 lines):", results["discovery_and_tag"])
    if args.testbed:
        env = testbed_env()
        results["warm_bundled_image_step"] = anyio.run(warm_image_step, env, 20)
        print("warm bundled image step:", results["warm_bundled_image_step"])
        results["builds"] = anyio.run(builds, env)
        print("builds:", results["builds"])
        results["startup_per_mode"] = per_mode_startup(env, 5)
        print("start-up per mode:", results["startup_per_mode"])
    print(f"wrote {write_results('images', results)}")


if __name__ == "__main__":
    main()
