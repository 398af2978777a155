"""What a first bundled build uploads from the client to Cloud Build: index path vs wheels.

A first bundled job builds three images (``docs/execution-modes.md``): the environment
image (the runtime's venv), the runtime image (Kinetic's source on it) and the project
image (the project's requirements; here one small line, ``tabulate``). Cloud Build
uploads each build context gzipped (:mod:`kinetic._images.cloudbuild`); this measures
those bytes, side by side in one run, for both install paths. Nothing is uploaded.

- **index** (Cloud Build's default): the real contexts, assembled as a build would
  (:func:`kinetic._images.runner_image._context`), hashes resolved with uv; GPU and CPU.
- **wheels**: CPU measured for real (every wheel downloaded with ``pip download`` into
  the context, as the Docker builder's default path does). GPU's CUDA wheels are
  gigabytes: the environment context is the sum of the sizes of the wheels the
  resolver lists for the pinned set (``uv pip compile --format pylock.toml``, one wheel
  per distribution, the best match for the image's platform), checked against the CPU
  measurement in the same run (``cpu.wheels.env_estimate_error``); the runtime and
  project contexts are measured for real on both paths.

Goal: the index path's GPU upload, excluding the user's own project, <= 10 MB.
Writes ``benchmarks/results/build_upload.json``.
"""

from __future__ import annotations

import argparse
import gzip
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from _common import machine, verdict, write_results
from packaging import tags
from packaging.utils import parse_wheel_filename

from kinetic._core.accel_runtime import runtime_request
from kinetic._images import runner_image, runtime_resolve

GOAL_BYTES = 10_000_000
PROJECT_LINES = ("tabulate==0.9.0",)


def uploaded(context: bytes) -> int:
    """Bytes Cloud Build's upload sends for ``context`` (gzip, as the builder does)."""
    return len(gzip.compress(context, mtime=0))


def plans(category: str, python: str) -> tuple[Any, Any, Any]:
    """(environment, runtime, project) plans of a first bundled build."""
    request = runtime_request((), category)
    resolved = runtime_resolve.resolve_runtime(request, python, runner_image.runtime_inputs(python))
    runtime = runner_image.runtime_plan("registry.invalid/kt", f"python:{python}-slim", resolved)
    return runtime.parent, runtime, runner_image.project_plan(runtime, PROJECT_LINES)


def contexts(path: str, env: Any, runtime: Any, project: Any, *, skip_env: bool) -> dict[str, Any]:
    """Upload bytes per image on ``path``; the environment image's only unless ``skip_env``."""
    out: dict[str, Any] = {}
    started = time.perf_counter()
    for name, the_plan in (("env", env), ("runtime", runtime), ("project", project)):
        if name == "env" and skip_env:
            continue
        context, note = runner_image._context(the_plan, path)
        if note is not None:
            raise SystemExit(f"the {path} path fell back: {note}")
        out[f"{name}_bytes"] = uploaded(context)
        out[f"{name}_context_raw_bytes"] = len(context)
    out["assembly_s"] = round(time.perf_counter() - started, 2)
    return out


def _supported(python: str) -> list[tags.Tag]:
    major, minor = (int(x) for x in python.split(".")[:2])
    # What pip takes for the image's platform: manylinux up to glibc 2.34, newest first
    # (pip widens an explicit manylinux tag to the older ones).
    glibc = int(runtime_resolve.MANYLINUX.rsplit("_", 1)[-1])
    platforms = [f"manylinux_2_{minor}_x86_64" for minor in range(glibc, 4, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    platforms.append("linux_x86_64")
    abi = f"cp{major}{minor}"
    return [
        *tags.cpython_tags((major, minor), abis=[abi, "abi3", "none"], platforms=platforms),
        *tags.compatible_tags((major, minor), interpreter=abi, platforms=platforms),
    ]


def wheel_sizes_from_resolver(requirements: tuple[str, ...], python: str) -> dict[str, int]:
    """For each distribution of ``requirements`` (plus pip and setuptools, which the
    wheels path fetches too), the size of the wheel a ``pip download`` for the image's
    platform would take, from the resolver's lock (sizes as the index lists them)."""
    uv = runtime_resolve.find_uv()
    if uv is None:
        raise SystemExit("uv is needed for the resolver's wheel sizes")
    supported = {tag: rank for rank, tag in enumerate(_supported(python))}
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text("".join(f"{r}\n" for r in (*requirements, "pip", "setuptools")))
        lock = Path(tmp) / "pylock.toml"
        cmd = runtime_resolve.uv_command(uv, python, req, None)
        subprocess.run([*cmd, "--format", "pylock.toml", "-o", str(lock)], check=True)
        packages = tomllib.loads(lock.read_text())["packages"]
    sizes: dict[str, int] = {}
    for package in packages:
        best: tuple[int, int] | None = None
        for wheel in package.get("wheels", []):
            filename = wheel["url"].rsplit("/", 1)[-1]
            ranks = [supported[t] for t in parse_wheel_filename(filename)[3] if t in supported]
            if ranks and (best is None or min(ranks) < best[0]):
                best = (min(ranks), int(wheel["size"]))
        if best is None:
            raise SystemExit(f"no wheel of {package['name']} for the image's platform")
        sizes[package["name"]] = best[1]
    return sizes


def run(python: str) -> dict[str, Any]:
    result: dict[str, Any] = {"machine": machine(), "python": python}
    result["project_lines"] = list(PROJECT_LINES)
    for category in ("cpu", "gpu"):
        env, runtime, project = plans(category, python)
        index = contexts("index", env, runtime, project, skip_env=False)
        wheels = contexts("wheels", env, runtime, project, skip_env=category == "gpu")
        sizes = wheel_sizes_from_resolver(env.requirements, python)
        estimate = sum(sizes.values())
        if category == "gpu":
            wheels["env_bytes"] = estimate
            wheels["env_method"] = "sum of the resolver's wheel sizes (not downloaded)"
        else:
            wheels["env_method"] = "measured: wheels downloaded into the context"
            wheels["env_estimate_from_resolver_sizes_bytes"] = estimate
            wheels["env_estimate_error"] = round(estimate / wheels["env_bytes"] - 1, 4)
        for row in (index, wheels):
            row["total_bytes"] = row["env_bytes"] + row["runtime_bytes"] + row["project_bytes"]
            row["total_mb"] = round(row["total_bytes"] / 1e6, 3)
        largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
        result[category] = {
            "distributions": len(env.requirements),
            "index": index,
            "wheels": wheels,
            "wheels_over_index": round(wheels["total_bytes"] / index["total_bytes"], 1),
            "largest_wheels_bytes": dict(largest),
        }
        print(
            f"{category}: index {index['total_mb']} MB "
            f"(env {index['env_bytes']} B, runtime {index['runtime_bytes']} B, "
            f"project {index['project_bytes']} B) vs wheels {wheels['total_mb']} MB: "
            f"x{result[category]['wheels_over_index']}"
        )
    gpu_index = result["gpu"]["index"]["total_bytes"]
    result["goal"] = {
        "what": "GPU first bundled build on Cloud Build, index path, bytes uploaded",
        "target_bytes": GOAL_BYTES,
        "value_bytes": gpu_index,
        "verdict": verdict(gpu_index, GOAL_BYTES),
    }
    print(
        f"goal <= {GOAL_BYTES / 1e6:.0f} MB: {gpu_index / 1e6:.3f} MB {result['goal']['verdict']}"
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", default="3.11", help="the images' Python (X.Y)")
    args = parser.parse_args()
    path = write_results("build_upload", run(args.python))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
