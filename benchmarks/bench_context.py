"""A job in a real project versus a one-file project, on the local backend (issue 15).

Four projects, each a git work tree holding the same script with a no-op function:

- ``one-file``: the script and a ``pyproject.toml``;
- ``ignored-10MB``: plus ``data/`` of 10 x 1 MB files, listed in ``.gitignore``;
- ``2000-modules``: plus 2,000 one-line modules (``pkg/m0.py`` ...);
- ``20000-files``: plus 20,000 one-line modules in 200 folders (``src/d0/m0.py`` ...).

For each, the **cold first call** (nothing cached: the tree is walked and zipped, the
archive stored, and the first job extracts it into the shared cache), then the
per-job round trip, submit -> value, median of ``--runs`` calls after one warm call,
the projects interleaved in each round, for the blocking ``fn()`` (as a user calls it)
and for ``fn.run_async().result()`` (no log streaming). Ratios are to the one-file
project in the same run. Targets: 2,000 modules <= 1.3x, 10 MB ignored <= 1.3x,
20,000 files <= 1.5x.

Also, in this process: the warm content address (``context_archive``) per project, to
show what the submitting side pays: watched (inotify saw no change: no walk), and with
the stat walk (``KINETIC_NO_WATCH=1``: a ``stat`` per file), what a new process's first
job or an unwatchable tree pays.

Usage: ``python benchmarks/bench_context.py [--runs 7]`` with an interpreter that imports
this repository's ``kinetic`` (else it re-executes itself with ``benchmarks/.envs/kinetic``).
Writes ``benchmarks/results/context.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import (
    ensure_kinetic_interpreter,
    machine,
    median,
    ms,
    summary,
    verdict,
    write_results,
)

TARGETS = {"ignored-10MB": 1.3, "2000-modules": 1.3, "20000-files": 1.5}
SCRIPT = '''\
"""The job of every benchmark project."""


def noop():
    return None
'''


def make_project(base: Path, name: str) -> Path:
    root = base / name
    root.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "pyproject.toml").write_text(f'[project]\nname = "{name}"\nversion = "0"\n')
    (root / "bench_job.py").write_text(SCRIPT)
    if name == "ignored-10MB":
        (root / ".gitignore").write_text("data/\n")
        (root / "data").mkdir()
        for i in range(10):
            (root / "data" / f"part{i}.bin").write_bytes(os.urandom(1 << 20))
    elif name == "2000-modules":
        (root / "pkg").mkdir()
        for i in range(2000):
            (root / "pkg" / f"m{i}.py").write_text(f"VALUE = {i}\n")
    elif name == "20000-files":
        for d in range(200):
            folder = root / "src" / f"d{d}"
            folder.mkdir(parents=True)
            for i in range(100):
                (folder / f"m{i}.py").write_text(f"VALUE = {i}\n")
    return root


def load_job(root: Path, name: str) -> Any:
    import kinetic

    module_name = "bench_job_" + name.replace("-", "_")
    spec = importlib.util.spec_from_file_location(module_name, root / "bench_job.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return kinetic.run(backend="local")(module.noop)


def timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def warm_addresses(projects: dict[str, Path], local_root: Path) -> dict[str, float]:
    """Per project, the median time of ``context_archive`` after one call (seconds)."""
    from kinetic._engine.packaging import context_archive

    out: dict[str, float] = {}
    for name, project in projects.items():
        root = project.resolve()
        context_archive(root, exclude=(local_root,))
        out[name] = median(
            [timed(lambda r=root: context_archive(r, exclude=(local_root,))) for _ in range(9)]
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="timed calls per project")
    ns = parser.parse_args()
    ensure_kinetic_interpreter()

    workdir = Path(tempfile.mkdtemp(prefix="kinetic-bench-context-"))
    for var in ("KINETIC_PROJECT", "GOOGLE_CLOUD_PROJECT", "KINETIC_BACKEND"):
        os.environ.pop(var, None)
    os.environ.pop("KINETIC_PACKAGE_ROOT", None)
    os.environ["KINETIC_LOCAL_ROOT"] = str(workdir / "local")
    os.environ["KINETIC_CACHE_DIR"] = str(workdir / "cache")
    os.environ["KINETIC_QUIET"] = "1"
    os.environ["KINETIC_PROFILES_FILE"] = str(workdir / "no-profiles.json")
    names = ["one-file", "ignored-10MB", "2000-modules", "20000-files"]
    results: dict[str, Any] = {"benchmark": "bench_context", "machine": machine()}
    try:
        print("building the projects ...", flush=True)
        projects = {name: make_project(workdir / "projects", name) for name in names}
        jobs = {name: load_job(projects[name], name) for name in names}
        time.sleep(0.1)  # let the files' timestamps settle, as a real project's have

        from kinetic._engine.packaging import context_archive

        cold: dict[str, float] = {}
        for name in names:
            cold[name] = timed(jobs[name])
            print(f"  cold first call {name:14s} {cold[name] * 1000:8.1f} ms", flush=True)
        for name in names:  # the warm-up call of the method
            jobs[name]()
        calls: dict[str, dict[str, list[float]]] = {
            "fn()": {n: [] for n in names},
            "run_async().result()": {n: [] for n in names},
        }
        for r in range(ns.runs):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                calls["fn()"][name].append(timed(jobs[name]))
                calls["run_async().result()"][name].append(
                    timed(lambda j=jobs[name]: j.run_async().result())
                )
        local_root = Path(os.environ["KINETIC_LOCAL_ROOT"])
        address = warm_addresses(projects, local_root)
        # The same without the watch: a new process's first job, or a tree inotify
        # cannot vouch for, takes the stat walk (one stat per file).
        from kinetic._engine.packaging import _forget_watches

        os.environ["KINETIC_NO_WATCH"] = "1"
        _forget_watches()
        walked = warm_addresses(projects, local_root)
        del os.environ["KINETIC_NO_WATCH"]
        _forget_watches()
        files = {
            name: context_archive(projects[name].resolve(), exclude=(local_root,)).file_count
            for name in names
        }
    finally:
        os.chdir("/")
        shutil.rmtree(workdir, ignore_errors=True)

    results["projects"] = {n: {"files_travelling": files[n]} for n in names}
    results["cold_first_call_ms"] = {n: ms(cold[n]) for n in names}
    results["round_trip"] = {}
    print(f"\nper-job round trip, median of {ns.runs} after one warm call (ms, ratio to one-file):")
    for kind, per in calls.items():
        base = median(per["one-file"])
        rows: dict[str, Any] = {}
        print(f"  {kind}")
        for name in names:
            m = median(per[name])
            ratio = round(m / base, 2)
            target = TARGETS.get(name)
            rows[name] = {
                **summary(per[name]),
                "ratio_to_one_file": ratio,
                "target": target,
                "verdict": verdict(ratio, target) if target else None,
            }
            mark = f"  target <= {target}x: {rows[name]['verdict']}" if target else ""
            print(f"    {name:14s} {m * 1000:8.1f}  {ratio:5.2f}x{mark}")
        results["round_trip"][kind] = rows
    results["warm_content_address_ms"] = {n: ms(address[n]) for n in names}
    results["warm_content_address_stat_walk_ms"] = {n: ms(walked[n]) for n in names}
    print("\ncold first call (ms):", {n: round(cold[n] * 1000, 1) for n in names})
    print("warm content address in-process, watched (ms):", {n: ms(address[n]) for n in names})
    print("warm content address, stat walk (ms):", {n: ms(walked[n]) for n in names})
    print("files travelling:", files)
    print(f"\nwrote {write_results('context', results)}")


if __name__ == "__main__":
    main()
