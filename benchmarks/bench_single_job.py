"""One job on the local backend, and the cost of the sync facade, measured in one run.

(a) Round trip of a no-op job, submit -> value, median of ``--runs`` after a warm-up, as
    a ratio to ``python -c "import cloudpickle"`` (same interpreter) timed in the same
    rounds. Target (DESIGN §7): <= 2x. Measured for the blocking call ``fn()`` (which
    streams the job's output) and for ``fn.run_async().result()``; the function lives in
    a tiny project of its own (a small package root). Also with this repository as the
    package root (the function defined in this script), to show what archiving costs.
    Where the time goes: a per-job timeline (file timestamps of the job's records plus
    the time the function ran), the runner alone on a kept job, and the submit steps
    timed one by one (internal API, best effort).
(b) Sync facade overhead per blocking call: a finished job's ``job.status()`` versus
    ``await job.aio.status()`` inside ``asyncio.run``, and a bare portal crossing versus
    awaiting a no-op coroutine. Target: <= 0.3 ms per call.
(c) Sync iterator overhead: ``kinetic._sync.portal.iterate`` over an async generator of
    ints versus ``async for`` directly, one item per crossing and in chunks (the public
    sync iterators cross once per chunk). Target: <= 0.05 ms per item.

Usage: ``benchmarks/.envs/kinetic/bin/python benchmarks/bench_single_job.py`` after
``bash benchmarks/envs.sh`` (another interpreter re-executes itself with that one).
Uses a temporary ``KINETIC_LOCAL_ROOT`` and ``KINETIC_QUIET=1``. Writes
``benchmarks/results/bench_single_job.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from _common import (
    REPO,
    ensure_kinetic_interpreter,
    isolated_project,
    machine,
    median,
    ms,
    summary,
    time_subprocess,
    verdict,
)
from _common import write_results as write

TARGET_ROUND_TRIP_RATIO = 2.0
TARGET_CALL_OVERHEAD_MS = 0.3
TARGET_ITEM_OVERHEAD_MS = 0.05

JOBS_MODULE = '''\
"""No-op jobs for bench_single_job."""
import time


def noop():
    return None


def stamp():
    return time.time()
'''


def noop_in_repo() -> None:
    """A no-op whose package root is this repository (the script's own project)."""


# --------------------------------------------------------------------------- (a) round trip


def round_trip(ns: argparse.Namespace, noop: Any, noop_repo: Any, cwd: Path) -> dict[str, Any]:
    cp = [sys.executable, "-c", "import cloudpickle"]
    bare = [sys.executable, "-c", "pass"]
    for _ in range(ns.warmup):
        noop()
        noop.run_async().result()
        time_subprocess(cp, cwd=cwd)
    tasks: dict[str, Callable[[], object]] = {
        "import_cloudpickle": lambda: time_subprocess(cp, cwd=cwd),
        "python_pass": lambda: time_subprocess(bare, cwd=cwd),
        "fn_call": noop,
        "run_async_result": lambda: noop.run_async().result(),
        # fn() is run_async().result(stream_logs=True): this isolates the log follower.
        "run_async_result_stream_logs": lambda: noop.run_async().result(stream_logs=True),
    }
    samples: dict[str, list[float]] = {k: [] for k in tasks}
    names = list(tasks)
    for r in range(ns.runs):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            tasks[name]()
            samples[name].append(time.perf_counter() - start)

    repo: list[float] = []
    noop_repo()  # warm: the repository's archive is built and stored once
    for _ in range(ns.repo_runs):
        start = time.perf_counter()
        noop_repo()
        repo.append(time.perf_counter() - start)

    base = median(samples["import_cloudpickle"])
    ratios = {
        "fn_call": median(samples["fn_call"]) / base,
        "run_async_result": median(samples["run_async_result"]) / base,
        "run_async_result_stream_logs": median(samples["run_async_result_stream_logs"]) / base,
        "fn_call_repo_root": median(repo) / base,
    }
    return {
        "wall": {k: summary(v) for k, v in samples.items()} | {"fn_call_repo_root": summary(repo)},
        "ratio_to_import_cloudpickle": {k: round(v, 3) for k, v in ratios.items()},
        "target_ratio": TARGET_ROUND_TRIP_RATIO,
        "verdict": {k: verdict(v, TARGET_ROUND_TRIP_RATIO) for k, v in ratios.items()},
    }


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def timeline(ns: argparse.Namespace, stamp: Any) -> tuple[dict[str, Any], Any]:
    """Median offsets (ms from the start of submission) of the events of one job.

    Events come from the clock here, from the job's function (``stamp`` returns the
    time it ran) and from file modification times of the job's records, which the
    kernel keeps on the same wall clock (to about a millisecond). Jobs run with
    ``result(cleanup=False)`` so the records survive to be read (not ``debug=True``,
    which now waits for a debugger to attach);
    the cleanup that ``result()`` does by default is timed on its own.
    """
    events: dict[str, list[float]] = {}
    kept = None
    for i in range(ns.runs // 2 + 1):
        t0 = time.time()
        job = stamp.run_async()
        t_submitted = time.time()
        t_fn = job.result(cleanup=False)
        t_result = time.time()
        jobdir = Path(job.bucket_name) / job.job_id
        marks = {
            "handle_written (submit wrote its last record)": _mtime(jobdir / "handle.json"),
            "log_opened (launcher about to exec the runner)": _mtime(jobdir / "logs.txt"),
            "launch_recorded (launch.json written)": _mtime(jobdir / "launch.json"),
            "run_async_returned": t_submitted,
            "function_ran (inside the job)": t_fn,
            "final_record_written (runner wrote status.json)": _mtime(jobdir / "status.json"),
            "runner_exited (launcher wrote exit_code)": _mtime(jobdir / "exit_code"),
            "result_returned": t_result,
        }
        c0 = time.perf_counter()
        if i == 0:
            kept = job  # a finished job whose records stay, for the facade and runner runs
        else:
            job.cleanup()
        cleanup = time.perf_counter() - c0
        if i == 0:
            continue  # warm-up
        for name, t in marks.items():
            if t is not None:
                events.setdefault(name, []).append(t - t0)
        events.setdefault("cleanup (separate call, part of result() by default)", []).append(
            cleanup
        )
    out = {name: ms(median(v)) for name, v in events.items()}
    return out, kept


def runner_alone(ns: argparse.Namespace, job: Any, cwd: Path) -> dict[str, Any]:
    """Re-run ``python -m runner`` on a kept, finished job, as the launcher would."""
    from kinetic._backends import local as local_backend

    storage_url = Path(job.bucket_name).as_uri()
    jobdir = Path(job.bucket_name) / job.job_id
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (env.get("PYTHONPATH", ""), local_backend._RUNNER_HOME) if p
    )
    args = ["--storage", storage_url, "--job-id", job.job_id]
    runner_argv = [sys.executable, "-m", "runner", *args]
    inproc = (
        "import json, sys, time\n"
        "t0 = time.perf_counter()\n"
        "import runner._main as m\n"
        "t1 = time.perf_counter()\n"
        f"code = m.main({args!r})\n"
        "t2 = time.perf_counter()\n"
        "print(json.dumps({'import_runner_main': t1 - t0, 'main': t2 - t1, 'code': code}))\n"
    )
    cmds = {
        "python_pass": [sys.executable, "-c", "pass"],
        "import_cloudpickle": [sys.executable, "-c", "import cloudpickle"],
        "import_runner_main": [sys.executable, "-c", "import runner._main"],
        "python_m_runner (whole job)": runner_argv,
    }
    for argv in cmds.values():
        time_subprocess(argv, cwd=jobdir, env=env)
    samples: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(ns.runs // 2):
        for name, argv in cmds.items():
            samples[name].append(time_subprocess(argv, cwd=jobdir, env=env))
    phases: dict[str, list[float]] = {"import_runner_main": [], "main": []}
    for _ in range(ns.runs // 2):
        done = subprocess.run(
            [sys.executable, "-c", inproc],
            cwd=jobdir,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        got = json.loads(done.stdout.strip().splitlines()[-1])
        for k, values in phases.items():
            values.append(got[k])
    return {
        "wall_median_ms": {k: ms(median(v)) for k, v in samples.items()},
        "in_process_median_ms": {k: ms(median(v)) for k, v in phases.items()},
    }


def submit_steps(ns: argparse.Namespace, raw_fn: Any, workdir: Path) -> dict[str, Any]:
    """The steps of ``submit`` timed one by one in this thread (internal API: best effort)."""
    try:
        from kinetic._backends._process import spawn_detached
        from kinetic._engine import packaging
        from kinetic._engine.submit import RunOptions, resolve_target
        from runner.fs import atomic_write
    except ImportError as exc:
        return {"error": f"internal API changed: {exc}"}

    async def _resolve() -> Any:  # the backend registry is per event loop
        return resolve_target(RunOptions(backend="local"))

    settings = asyncio.run(_resolve())[0]
    local_root = Path(settings.local_root)
    root = packaging.find_package_root(packaging.function_source_dir(raw_fn))
    scratch = workdir / "steps"
    scratch.mkdir()
    spec = json.dumps({"x": "y" * 400}).encode()
    counter = iter(range(10**9))

    def writes() -> None:
        n = next(counter)
        for name in ("payload.pkl", "spec.json", "handle.json", "launch.json"):
            atomic_write(scratch / str(n) / name, spec)

    def spawn() -> None:
        n = next(counter)
        spawn_detached(
            ["/bin/true"],
            log_file=scratch / f"log{n}",
            status_file=scratch / f"status{n}",
            cwd=scratch,
            env=os.environ,
        )

    steps: dict[str, Callable[[], object]] = {
        "resolve_target (settings, profile file)": lambda: asyncio.run(_resolve()),
        "find_package_root": lambda: packaging.find_package_root(
            packaging.function_source_dir(raw_fn)
        ),
        "pickle_payload": lambda: packaging.pickle_payload(raw_fn, (), {}, root),
        "context_archive (tiny project, warm)": lambda: packaging.context_archive(
            root, exclude=(local_root,)
        ),
        "context_archive (this repository, warm)": lambda: packaging.context_archive(
            REPO, exclude=(local_root,)
        ),
        "4 atomic writes (payload, spec, handle, launch)": writes,
        "spawn_detached(/bin/true) (launcher shell)": spawn,
    }
    out: dict[str, Any] = {}
    for name, step in steps.items():
        try:
            step()
            samples = []
            for _ in range(ns.runs):
                start = time.perf_counter()
                step()
                samples.append(time.perf_counter() - start)
            out[name] = ms(median(samples))
        except Exception as exc:  # noqa: BLE001 - a changed internal API must not stop the run
            out[name] = f"error: {type(exc).__name__}: {exc}"
    time.sleep(0.2)  # let the detached /bin/true launchers finish before the dir goes
    return out


# --------------------------------------------------------------------------- (b), (c) facade


def facade_overhead(ns: argparse.Namespace, job: Any) -> dict[str, Any]:
    import anyio.to_thread

    from kinetic._sync import portal

    aio_job = job.aio
    assert job.status().is_terminal, "the kept job must be finished"

    async def nop() -> None:
        return None

    async def hop() -> None:  # one worker-thread hop, as every local storage call makes
        await anyio.to_thread.run_sync(int)

    async def async_status(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            await aio_job.status()
        return (time.perf_counter() - start) / n

    async def async_nop(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            await nop()
        return (time.perf_counter() - start) / n

    def sync_status(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            job.status()
        return (time.perf_counter() - start) / n

    def sync_nop(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            portal.call(nop)
        return (time.perf_counter() - start) / n

    async def async_hop(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            await hop()
        return (time.perf_counter() - start) / n

    def sync_hop(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            portal.call(hop)
        return (time.perf_counter() - start) / n

    n_status, n_nop = ns.calls, ns.calls * 4
    sync_status(50)
    asyncio.run(async_status(50))
    rows: dict[str, list[float]] = {k: [] for k in ("sync_status", "async_status")}
    rows |= {"sync_nop": [], "async_nop": [], "sync_hop": [], "async_hop": []}
    for _ in range(ns.rounds):
        rows["sync_status"].append(sync_status(n_status))
        rows["async_status"].append(asyncio.run(async_status(n_status)))
        rows["sync_nop"].append(sync_nop(n_nop))
        rows["async_nop"].append(asyncio.run(async_nop(n_nop)))
        rows["sync_hop"].append(sync_hop(n_status))
        rows["async_hop"].append(asyncio.run(async_hop(n_status)))
    per_call = {k: median(v) for k, v in rows.items()}
    status_overhead = per_call["sync_status"] - per_call["async_status"]
    nop_overhead = per_call["sync_nop"] - per_call["async_nop"]
    hop_overhead = per_call["sync_hop"] - per_call["async_hop"]
    return {
        "calls_per_round": {"status": n_status, "nop": n_nop},
        "rounds": ns.rounds,
        "per_call_ms": {k: round(v * 1000, 4) for k, v in per_call.items()},
        "overhead_per_call_ms": {
            "status (job.status() vs await job.aio.status())": round(status_overhead * 1000, 4),
            "bare crossing (portal.call(nop) vs await nop())": round(nop_overhead * 1000, 4),
            "crossing + one to_thread hop (portal.call(hop) vs await hop())": round(
                hop_overhead * 1000, 4
            ),
        },
        "target_ms": TARGET_CALL_OVERHEAD_MS,
        "verdict": verdict(status_overhead * 1000, TARGET_CALL_OVERHEAD_MS),
    }


def iterator_overhead(ns: argparse.Namespace) -> dict[str, Any]:
    from kinetic._sync import portal

    n, chunk = ns.items, ns.chunk

    async def ints() -> AsyncIterator[int]:
        for i in range(n):
            yield i

    async def chunks() -> AsyncIterator[list[int]]:
        for i in range(0, n, chunk):
            yield list(range(i, min(i + chunk, n)))

    async def consume_items() -> float:
        start = time.perf_counter()
        async for _ in ints():
            pass
        return (time.perf_counter() - start) / n

    async def consume_chunks() -> float:
        start = time.perf_counter()
        async for part in chunks():
            for _ in part:
                pass
        return (time.perf_counter() - start) / n

    def sync_items() -> float:
        start = time.perf_counter()
        for _ in portal.iterate(ints):
            pass
        return (time.perf_counter() - start) / n

    def sync_chunks() -> float:
        start = time.perf_counter()
        for part in portal.iterate(chunks):
            for _ in part:
                pass
        return (time.perf_counter() - start) / n

    sync_items()
    rows: dict[str, list[float]] = {
        "sync_items": [],
        "async_items": [],
        "sync_chunks": [],
        "async_chunks": [],
    }
    for _ in range(ns.rounds):
        rows["sync_items"].append(sync_items())
        rows["async_items"].append(asyncio.run(consume_items()))
        rows["sync_chunks"].append(sync_chunks())
        rows["async_chunks"].append(asyncio.run(consume_chunks()))
    per_item = {k: median(v) for k, v in rows.items()}
    one = per_item["sync_items"] - per_item["async_items"]
    chunked = per_item["sync_chunks"] - per_item["async_chunks"]
    return {
        "items": n,
        "chunk": chunk,
        "rounds": ns.rounds,
        "per_item_ms": {k: round(v * 1000, 5) for k, v in per_item.items()},
        "overhead_per_item_ms": {
            "one item per crossing": round(one * 1000, 5),
            f"chunks of {chunk} (as the public sync iterators)": round(chunked * 1000, 5),
        },
        "target_ms": TARGET_ITEM_OVERHEAD_MS,
        "verdict": {
            "one item per crossing": verdict(one * 1000, TARGET_ITEM_OVERHEAD_MS),
            "chunked": verdict(chunked * 1000, TARGET_ITEM_OVERHEAD_MS),
        },
    }


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="timed round trips (default 20)")
    parser.add_argument("--repo-runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of (b) and (c)")
    parser.add_argument("--calls", type=int, default=1000, help="status calls per round")
    parser.add_argument("--items", type=int, default=5000)
    parser.add_argument("--chunk", type=int, default=64)
    ns = parser.parse_args()
    ensure_kinetic_interpreter()

    workdir, project = isolated_project("kinetic-bench-single-", "kbench_jobs", JOBS_MODULE)

    import kinetic

    kbench_jobs = importlib.import_module("kbench_jobs")  # written above, in the project

    noop = kinetic.run(backend="local")(kbench_jobs.noop)
    stamp = kinetic.run(backend="local")(kbench_jobs.stamp)
    noop_repo = kinetic.run(backend="local")(noop_in_repo)

    results: dict[str, Any] = {"benchmark": "bench_single_job", "machine": machine()}
    try:
        print(f"(a) round trip, {ns.runs} runs after {ns.warmup} warm-ups ...", flush=True)
        results["round_trip"] = rt = round_trip(ns, noop, noop_repo, project)
        print("    timeline, runner alone, submit steps ...", flush=True)
        events, kept = timeline(ns, stamp)
        results["timeline_median_ms_since_submit"] = events
        results["runner_alone"] = runner_alone(ns, kept, project)
        results["submit_steps_median_ms"] = submit_steps(ns, kbench_jobs.noop, workdir)
        print("(b) facade overhead per call ...", flush=True)
        results["facade_call"] = fc = facade_overhead(ns, kept)
        print("(c) iterator overhead per item ...", flush=True)
        results["facade_iterate"] = fi = iterator_overhead(ns)
        kept.cleanup()
    except Exception:
        traceback.print_exc()
        raise
    finally:
        os.chdir("/")
        shutil.rmtree(workdir, ignore_errors=True)

    w = rt["wall"]
    r = rt["ratio_to_import_cloudpickle"]
    print("\n(a) local single job, no-op, medians (ms):")
    print(f"    python -c pass                 {w['python_pass']['median_ms']:8.1f}")
    print(f"    python -c 'import cloudpickle' {w['import_cloudpickle']['median_ms']:8.1f}  = 1x")
    for key, label in (
        ("fn_call", "fn()  [small project]"),
        ("run_async_result", "fn.run_async().result()"),
        ("run_async_result_stream_logs", "  same, result(stream_logs=True)"),
        ("fn_call_repo_root", "fn()  [repository as root]"),
    ):
        print(
            f"    {label:30s} {w[key]['median_ms']:8.1f}  = {r[key]:.2f}x  "
            f"(target <= {TARGET_ROUND_TRIP_RATIO}x: {rt['verdict'][key]})"
        )
    print("    timeline of run_async().result() (ms since submit started):")
    for name, v in sorted(events.items(), key=lambda kv: kv[1]):
        print(f"      {v:8.1f}  {name}")
    print("    runner alone on a kept job (wall ms):")
    for name, v in results["runner_alone"]["wall_median_ms"].items():
        print(f"      {v:8.1f}  {name}")
    for name, v in results["runner_alone"]["in_process_median_ms"].items():
        print(f"      {v:8.1f}  in process: {name}")
    print("    submit steps, one by one (ms):")
    for name, v in results["submit_steps_median_ms"].items():
        print(f"      {v if isinstance(v, str) else f'{v:8.2f}'}  {name}")
    print("\n(b) sync facade overhead per call (ms):")
    for name, v in fc["per_call_ms"].items():
        print(f"    {name:28s} {v:8.4f}")
    for name, v in fc["overhead_per_call_ms"].items():
        print(f"    overhead {name}: {v:.4f}")
    print(f"    target <= {TARGET_CALL_OVERHEAD_MS} ms: {fc['verdict']}")
    print(f"\n(c) sync iterator overhead per item ({fi['items']} items, ms):")
    for name, v in fi["overhead_per_item_ms"].items():
        print(f"    {name:48s} {v:.5f}")
    print(f"    target <= {TARGET_ITEM_OVERHEAD_MS} ms: {fi['verdict']}")
    print(f"\nwrote {write('bench_single_job', results)}")


if __name__ == "__main__":
    main()
