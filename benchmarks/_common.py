"""Helpers shared by the benchmark scripts: timing, statistics, result files.

Every figure is a median over repeated runs measured side by side in one run;
absolute times on a shared 2-core machine are noise, ratios are what count.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ENVS = HERE / ".envs"
RESULTS = HERE / "results"


def env_python(name: str) -> Path:
    """The interpreter of the benchmark venv ``name`` (made by ``benchmarks/envs.sh``)."""
    py = ENVS / name / "bin" / "python"
    if not py.exists():
        raise SystemExit(f"{py} is missing: run `bash benchmarks/envs.sh` first")
    return py


def ensure_kinetic_interpreter() -> None:
    """Re-execute under the ``kinetic`` benchmark venv unless this one imports our kinetic."""
    spec = importlib.util.find_spec("kinetic")
    origin = Path(spec.origin).resolve() if spec and spec.origin else None
    if origin is not None and origin.is_relative_to(REPO):
        return
    py = env_python("kinetic")
    os.execv(str(py), [str(py), *sys.argv])


def ms(seconds: float) -> float:
    """Seconds as milliseconds, rounded for reports."""
    return round(seconds * 1000.0, 3)


def summary(samples: Sequence[float]) -> dict[str, Any]:
    """Median, quartiles and extremes of ``samples`` (seconds), in milliseconds."""
    ordered = sorted(samples)
    q = statistics.quantiles(ordered, n=4) if len(ordered) >= 2 else [ordered[0]] * 3
    return {
        "n": len(ordered),
        "median_ms": ms(statistics.median(ordered)),
        "p25_ms": ms(q[0]),
        "p75_ms": ms(q[2]),
        "min_ms": ms(ordered[0]),
        "max_ms": ms(ordered[-1]),
    }


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples)


def time_subprocess(
    argv: Sequence[str], *, cwd: str | os.PathLike[str], env: Mapping[str, str] | None = None
) -> float:
    """Wall time (s) of one run of ``argv`` to exit; fails loudly if it fails."""
    start = time.perf_counter()
    done = subprocess.run(
        list(argv),
        cwd=cwd,
        env=None if env is None else dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=False,
    )
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{list(argv)} failed ({done.returncode}): {done.stderr.decode()}")
    return elapsed


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    try:
        load = os.getloadavg()
    except OSError:
        load = (-1.0, -1.0, -1.0)
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": [round(x, 2) for x in load],
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def write_results(name: str, data: Mapping[str, Any]) -> Path:
    """Write ``results/<name>.json`` (atomically) and return its path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def verdict(value: float, target: float, *, lower_is_better: bool = True) -> str:
    """``"PASS"`` or ``"MISS"`` against a target."""
    ok = value <= target if lower_is_better else value >= target
    return "PASS" if ok else "MISS"


def isolated_project(prefix: str, module: str, source: str) -> tuple[Path, Path]:
    """A temporary tiny project holding ``{module}.py``, entered as the job's package root.

    Points every Kinetic setting of this process into it (a private local root, no
    profiles, no GCP project, no notice), puts it on ``sys.path`` and makes it the cwd.
    Returns ``(workdir, project)``; the caller removes ``workdir``.
    """
    import tempfile

    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    project = workdir / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(f'[project]\nname = "{module}"\nversion = "0"\n')
    (project / f"{module}.py").write_text(source)
    for name in (
        "KINETIC_PROJECT",
        "GOOGLE_CLOUD_PROJECT",
        "KINETIC_BACKEND",
        "KINETIC_PACKAGE_ROOT",
    ):
        os.environ.pop(name, None)
    os.environ["KINETIC_LOCAL_ROOT"] = str(workdir / "local")
    os.environ["KINETIC_QUIET"] = "1"
    os.environ["KINETIC_PROFILES_FILE"] = str(workdir / "no-profiles.json")
    sys.path.insert(0, str(project))
    os.chdir(project)
    return workdir, project
