"""Fan-out on the local backend versus Ray and a process pool, measured side by side in one run.

(a) Throughput, submission -> every result in hand, of ``N`` trivial inputs (``x * x``),
    for N in ``--sizes`` (10,000 and 1,000), median of ``--runs`` interleaved rounds after
    a warm-up (the order of the contenders rotates from round to round):

    - ``kinetic``: ``square.run_async_map(range(N)).results()`` (blocking API), each
      input's result durably appended to its worker's results log; a temporary
      ``KINETIC_LOCAL_ROOT``, ``KINETIC_QUIET=1``, the function in a tiny project of its
      own (a small package root). ``results()`` includes its default cleanup.
    - ``kinetic_async``: the same through ``await square.aio.run_async_map(...)`` and
      ``await batch.results()`` inside ``asyncio.run`` (the loop start is not timed).
    - ``ray``: ``ray.get([f.remote(i) for i in range(N)])`` in a subprocess run by the
      ``ray`` benchmark venv (Ray is never a dependency of this project); a fresh Ray per
      round; ``ray.init()`` and a warm-up of 200 tasks are excluded from the figure,
      ``ray.init()`` is reported separately.
    - ``pool_chunksize_1``: ``ProcessPoolExecutor(2).map(f, range(N), chunksize=1)``,
      pool start and shutdown included, no durability. Targets (DESIGN §7): kinetic
      >= 2x Ray's throughput and >= 1.0x this pool's.
    - ``pool_chunked``: the same with ``chunksize=N // 8``: the ceiling, beside it.

(b) Latency from the first input's completion to its handle arriving from
    ``as_completed()`` (blocking iterator and ``async for``): a batch of 3 inputs where
    input 0 sleeps briefly, takes ``time.time()`` and returns it, and the others sleep
    longer; the consumer takes ``time.time()`` when input 0's handle arrives. Median of
    ``--latency-batches`` batches each.

(c) Where Kinetic's time goes, for each N (separate runs, internal API, best effort): the
    timeline seen by the consumer (submission returns, the supervisor's ``supervisor.json``
    appears, first and last handle from ``as_completed()``, then ``results(cleanup=False)``
    and ``cleanup()``) and the CPU time of the consumer process (all threads,
    ``getrusage``), of the supervisor and of its workers (``/proc/<pid>/schedstat``
    sampled every 10 ms, so the last few ms of each process may be missed).

Usage: ``benchmarks/.envs/kinetic/bin/python benchmarks/bench_fanout.py`` after
``bash benchmarks/envs.sh`` (another interpreter re-executes itself with that one unless
it imports this repository's kinetic). ``--help`` for the knobs; ``--runs 1 --sizes 1000``
makes a quick run. Writes ``benchmarks/results/fanout.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import importlib
import importlib.util
import json
import multiprocessing
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import (
    ensure_kinetic_interpreter,
    env_python,
    isolated_project,
    machine,
    median,
    ms,
    summary,
    verdict,
)
from _common import write_results as write

TARGET_VS_RAY = 2.0
TARGET_VS_POOL = 1.0
POOL_WORKERS = 2
RAY_WARMUP_TASKS = 200
RAY_TIMEOUT_S = 900.0
KINETIC_TIMEOUT_S = 600.0
SMALL = 5_000  # sizes below this are measured --small-reps times per round (noisier)

JOBS_MODULE = '''\
"""Jobs for bench_fanout (a tiny project of its own: a small package root)."""
import time

import kinetic


@kinetic.run(accelerator="cpu")
def square(x):
    return x * x


@kinetic.run(accelerator="cpu")
def first_stamp(i, first_delay, other_delay):
    """Input 0 returns the wall-clock time it finished at; the others are slower."""
    if i == 0:
        time.sleep(first_delay)
        return time.time()
    time.sleep(other_delay)
    return None
'''

# Run by the ray venv's interpreter. argv[1]: JSON {"sizes": [...], "temp_dir": "..."}.
# Prints one JSON line: {"init_s": ..., "warmup_s": ..., "wall_s": {"N": [seconds, ...]}}.
RAY_SCRIPT = r"""
import json, sys, time
cfg = json.loads(sys.argv[1])
t0 = time.perf_counter()
import ray
t_import = time.perf_counter() - t0
t0 = time.perf_counter()
ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR",
         _temp_dir=cfg["temp_dir"])
t_init = time.perf_counter() - t0

@ray.remote
def square(x):
    return x * x

t0 = time.perf_counter()
assert ray.get([square.remote(i) for i in range(cfg["warmup"])]) == [
    i * i for i in range(cfg["warmup"])]
t_warm = time.perf_counter() - t0
wall = {}
for n in cfg["sizes"]:
    for _ in range(cfg["reps"][str(n)]):
        t0 = time.perf_counter()
        out = ray.get([square.remote(i) for i in range(n)])
        wall.setdefault(str(n), []).append(time.perf_counter() - t0)
        assert out == [i * i for i in range(n)]
cpus = ray.cluster_resources().get("CPU")
ray.shutdown()
print(json.dumps({"import_s": t_import, "init_s": t_init, "warmup_s": t_warm,
                  "wall_s": wall, "cluster_cpus": cpus, "version": ray.__version__}))
"""


def square_local(x: int) -> int:
    """The process pool's function (module level: pickled by reference)."""
    return x * x


# ---------------------------------------------------------------------------- contenders


def run_kinetic(jobs: Any, n: int) -> tuple[float, float]:
    """(submit seconds, total seconds) of ``square.run_async_map(range(n)).results()``."""
    start = time.perf_counter()
    batch = jobs.square.run_async_map(range(n))
    submitted = time.perf_counter()
    out = batch.results(timeout=KINETIC_TIMEOUT_S)
    end = time.perf_counter()
    if out != [i * i for i in range(n)]:
        raise AssertionError("kinetic returned wrong results")
    return submitted - start, end - start


def run_kinetic_async(jobs: Any, n: int) -> tuple[float, float]:
    """As :func:`run_kinetic` through the async API (``asyncio.run`` start not timed)."""

    async def go() -> tuple[float, float, list[Any]]:
        start = time.perf_counter()
        batch = await jobs.square.aio.run_async_map(range(n))
        submitted = time.perf_counter()
        out = await batch.results(timeout=KINETIC_TIMEOUT_S)
        return submitted - start, time.perf_counter() - start, out

    submit_s, total_s, out = asyncio.run(go())
    if out != [i * i for i in range(n)]:
        raise AssertionError("kinetic (async) returned wrong results")
    return submit_s, total_s


def run_kinetic_stream(jobs: Any, n: int) -> tuple[float, float]:
    """The headline pattern: ``async for h in batch.as_completed(): await h.result()``
    (default cleanup on every input, so the batch is cleaned up too)."""

    async def go() -> tuple[float, float, list[Any]]:
        start = time.perf_counter()
        batch = await jobs.square.aio.run_async_map(range(n))
        submitted = time.perf_counter()
        out = [await h.result() async for h in batch.as_completed(timeout=KINETIC_TIMEOUT_S)]
        return submitted - start, time.perf_counter() - start, out

    submit_s, total_s, out = asyncio.run(go())
    if sorted(out) != [i * i for i in range(n)]:
        raise AssertionError("kinetic (as_completed) returned wrong results")
    return submit_s, total_s


def run_kinetic_stream_blocking(jobs: Any, n: int) -> tuple[float, float]:
    """The README's blocking loop: ``for h in batch.as_completed(): h.result()``."""
    start = time.perf_counter()
    batch = jobs.square.run_async_map(range(n))
    submitted = time.perf_counter()
    out = [h.result() for h in batch.as_completed(timeout=KINETIC_TIMEOUT_S)]
    end = time.perf_counter()
    if sorted(out) != [i * i for i in range(n)]:
        raise AssertionError("kinetic (blocking as_completed) returned wrong results")
    return submitted - start, end - start


_KINETIC_CONTENDERS = {
    "kinetic": run_kinetic,
    "kinetic_async": run_kinetic_async,
    "kinetic_async_as_completed": run_kinetic_stream,
    "kinetic_as_completed": run_kinetic_stream_blocking,
}


def run_pool(n: int, chunksize: int) -> float:
    """Seconds of ``ProcessPoolExecutor(2).map(f, range(n), chunksize)``, pool start included."""
    start = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(POOL_WORKERS) as ex:
        out = list(ex.map(square_local, range(n), chunksize=chunksize))
    elapsed = time.perf_counter() - start
    if out != [i * i for i in range(n)]:
        raise AssertionError("the process pool returned wrong results")
    return elapsed


def run_ray(ray_py: Path, reps: dict[int, int], workdir: Path) -> dict[str, Any]:
    """One fresh Ray in a subprocess: init, warm-up, then each size ``reps[size]`` times."""
    temp_dir = Path(tempfile.mkdtemp(prefix="kray", dir="/tmp"))  # short: Ray's socket paths
    cfg = {
        "sizes": list(reps),
        "reps": {str(n): k for n, k in reps.items()},
        "temp_dir": str(temp_dir),
        "warmup": RAY_WARMUP_TASKS,
    }
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    for name in ("KINETIC_LOCAL_ROOT", "PYTHONPATH"):
        env.pop(name, None)
    proc = subprocess.Popen(
        [str(ray_py), "-c", RAY_SCRIPT, json.dumps(cfg)],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own group: a stuck Ray is ended as a whole, by id
    )
    try:
        out, err = proc.communicate(timeout=RAY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise RuntimeError(f"ray did not finish within {RAY_TIMEOUT_S} s") from None
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(f"ray run failed ({proc.returncode}):\n{err.decode()[-3000:]}")
    return dict(json.loads(out.decode().strip().splitlines()[-1]))


# ------------------------------------------------------------------------- (a) throughput


def throughput(ns: argparse.Namespace, jobs: Any, workdir: Path) -> dict[str, Any]:
    sizes: list[int] = ns.sizes
    ray_py = env_python("ray")
    # Warm-up: imports, the context archive (stored once), the pool's code paths.
    for contender in _KINETIC_CONTENDERS.values():
        contender(jobs, min(sizes))
    run_pool(min(sizes), 1)

    names = [*_KINETIC_CONTENDERS, "pool_chunksize_1", "pool_chunked", "ray"]
    wall: dict[int, dict[str, list[float]]] = {n: {k: [] for k in names} for n in sizes}
    submit: dict[int, dict[str, list[float]]] = {
        n: {k: [] for k in _KINETIC_CONTENDERS} for n in sizes
    }
    ray_runs: list[dict[str, Any]] = []
    reps = {n: ns.small_reps if n < SMALL else 1 for n in sizes}
    for r in range(ns.runs):
        order = names[r % len(names) :] + names[: r % len(names)]
        print(f"  round {r + 1}/{ns.runs}: {' '.join(order)}", flush=True)
        for name in order:
            if name == "ray":
                got = run_ray(ray_py, reps, workdir)
                ray_runs.append(got)
                for n in sizes:
                    wall[n]["ray"].extend(got["wall_s"][str(n)])
                continue
            for n in [size for size in sizes for _ in range(reps[size])]:
                if name in _KINETIC_CONTENDERS:
                    s, t = _KINETIC_CONTENDERS[name](jobs, n)
                    submit[n][name].append(s)
                elif name == "pool_chunksize_1":
                    t = run_pool(n, 1)
                else:
                    t = run_pool(n, max(1, n // 8))
                wall[n][name].append(t)

    per_size: dict[str, Any] = {}
    for n in sizes:
        rate = {k: n / median(v) for k, v in wall[n].items()}
        ratios = {
            "kinetic/ray": rate["kinetic"] / rate["ray"],
            "kinetic/pool_chunksize_1": rate["kinetic"] / rate["pool_chunksize_1"],
            "kinetic_async/ray": rate["kinetic_async"] / rate["ray"],
            "kinetic_async/pool_chunksize_1": rate["kinetic_async"] / rate["pool_chunksize_1"],
            "pool_chunked/pool_chunksize_1": rate["pool_chunked"] / rate["pool_chunksize_1"],
            "kinetic/pool_chunked": rate["kinetic"] / rate["pool_chunked"],
            "async_as_completed/pool_chunksize_1": rate["kinetic_async_as_completed"]
            / rate["pool_chunksize_1"],
            "async_as_completed/async_results": rate["kinetic_async_as_completed"]
            / rate["kinetic_async"],
            "blocking_as_completed/async_as_completed": rate["kinetic_as_completed"]
            / rate["kinetic_async_as_completed"],
        }
        per_size[str(n)] = {
            "inputs_per_s": {k: round(v, 1) for k, v in rate.items()},
            "wall": {k: summary(v) for k, v in wall[n].items()},
            "submit_wall": {k: summary(v) for k, v in submit[n].items()},
            "ratios": {k: round(v, 3) for k, v in ratios.items()},
            "verdict": {
                f"kinetic/ray >= {TARGET_VS_RAY}": verdict(
                    ratios["kinetic/ray"], TARGET_VS_RAY, lower_is_better=False
                ),
                f"kinetic/pool_chunksize_1 >= {TARGET_VS_POOL}": verdict(
                    ratios["kinetic/pool_chunksize_1"], TARGET_VS_POOL, lower_is_better=False
                ),
                "async_as_completed/pool_chunksize_1 >= 1.0": verdict(
                    ratios["async_as_completed/pool_chunksize_1"], 1.0, lower_is_better=False
                ),
                "async_as_completed/async_results >= 0.8": verdict(
                    ratios["async_as_completed/async_results"], 0.8, lower_is_better=False
                ),
                "blocking_as_completed/async_as_completed >= 0.7": verdict(
                    ratios["blocking_as_completed/async_as_completed"], 0.7, lower_is_better=False
                ),
            },
        }
    return {
        "sizes": sizes,
        "runs": ns.runs,
        "samples_per_round": {str(n): k for n, k in reps.items()},
        "per_size": per_size,
        "ray": {
            "version": ray_runs[0]["version"] if ray_runs else None,
            "cluster_cpus": ray_runs[0]["cluster_cpus"] if ray_runs else None,
            "import": summary([x["import_s"] for x in ray_runs]),
            "init (excluded)": summary([x["init_s"] for x in ray_runs]),
            f"warmup {RAY_WARMUP_TASKS} tasks (excluded)": summary(
                [x["warmup_s"] for x in ray_runs]
            ),
        },
        "pool": {
            "workers": POOL_WORKERS,
            "start_method": multiprocessing.get_start_method(),
            "note": "pool start and shutdown are inside the timed region",
        },
    }


# ------------------------------------------------------------------------- (b) latency


def latency(ns: argparse.Namespace, jobs: Any) -> dict[str, Any]:
    first, other = ns.first_delay, ns.other_delay
    inputs = [(i, first, other) for i in range(3)]

    def sync_once() -> float:
        batch = jobs.first_stamp.run_async_map(inputs)
        arrived = None
        for h in batch.as_completed(timeout=60):
            if h.group_index == 0:
                arrived = time.time()
        values = batch.results(timeout=60)
        if arrived is None or not isinstance(values[0], float):
            raise AssertionError("input 0 did not report its completion time")
        return arrived - values[0]

    async def async_once() -> float:
        batch = await jobs.first_stamp.aio.run_async_map(inputs)
        arrived = None
        async for h in batch.as_completed(timeout=60):
            if h.group_index == 0:
                arrived = time.time()
        values = await batch.results(timeout=60)
        if arrived is None or not isinstance(values[0], float):
            raise AssertionError("input 0 did not report its completion time")
        return arrived - values[0]

    samples: dict[str, list[float]] = {"sync_as_completed": [], "async_as_completed": []}
    for _ in range(ns.latency_batches):
        samples["sync_as_completed"].append(sync_once())
        samples["async_as_completed"].append(asyncio.run(async_once()))
    return {
        "batches": ns.latency_batches,
        "input0_sleep_s": first,
        "other_inputs_sleep_s": other,
        "first_completion_to_handle": {k: summary(v) for k, v in samples.items()},
    }


# ------------------------------------------------------------------------- (c) breakdown


def _proc_cpu(pid: int) -> float | None:
    """CPU seconds (user + system, ns resolution) of ``pid``'s main thread; None if gone."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class CpuSampler(threading.Thread):
    """Follow a batch's supervisor (found by its ``supervisor.json``) and its workers."""

    def __init__(self, group_dir: Path) -> None:
        super().__init__(daemon=True)
        self.group_dir = group_dir
        self.stop_flag = threading.Event()
        self.supervisor = 0.0
        self.workers: dict[int, float] = {}
        self.supervisor_seen_at: float | None = None
        self.own_cpu = 0.0  # this thread's CPU time, to subtract from the consumer's

    def run(self) -> None:
        try:
            self._follow()
        finally:
            self.own_cpu = time.thread_time()

    def _follow(self) -> None:
        pid = None
        while not self.stop_flag.is_set() and pid is None:
            try:
                pid = int(json.loads((self.group_dir / "supervisor.json").read_text())["pid"])
                self.supervisor_seen_at = time.perf_counter()
            except (OSError, ValueError, KeyError):
                time.sleep(0.002)
        while pid is not None and not self.stop_flag.is_set():
            cpu = _proc_cpu(pid)
            if cpu is None:
                return
            self.supervisor = cpu
            for child in _children(pid):
                got = _proc_cpu(child)
                if got is not None:
                    self.workers[child] = got
            time.sleep(0.01)


def breakdown_one(jobs: Any, n: int, runs: int) -> dict[str, Any]:
    rows: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        rows.setdefault(key, []).append(value)

    for _ in range(runs):
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        batch = jobs.square.run_async_map(range(n))
        t_submit = time.perf_counter()
        sampler = CpuSampler(batch.aio._backend.batches.group_dir(batch.group_id))
        sampler.start()
        first = None
        count = 0
        for _h in batch.as_completed(timeout=KINETIC_TIMEOUT_S):
            count += 1
            if first is None:
                first = time.perf_counter()
        t_last = time.perf_counter()
        out = batch.results(timeout=KINETIC_TIMEOUT_S, cleanup=False)
        t_loaded = time.perf_counter()
        batch.cleanup()
        t_end = time.perf_counter()
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        sampler.stop_flag.set()
        sampler.join(5)
        if count != n or out != [i * i for i in range(n)] or first is None:
            raise AssertionError("kinetic returned wrong results")
        add("wall", t_end - t0)
        add("submission: run_async_map returns", t_submit - t0)
        if sampler.supervisor_seen_at is not None:
            add("supervisor up: supervisor.json seen", sampler.supervisor_seen_at - t0)
        add("first handle from as_completed()", first - t0)
        add("last handle from as_completed()", t_last - t0)
        add("then results(cleanup=False): load + decode", t_loaded - t_last)
        add("then cleanup()", t_end - t_loaded)
        add(
            "cpu consumer process",
            ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime - sampler.own_cpu,
        )
        add("cpu supervisor", sampler.supervisor)
        add("cpu workers", sum(sampler.workers.values()))
        add("workers seen", float(len(sampler.workers)))
    med = {k: median(v) for k, v in rows.items()}
    return {
        "runs": runs,
        "timeline_ms_from_submission_start": {
            k: ms(v) for k, v in med.items() if not k.startswith(("cpu", "workers"))
        },
        "cpu_ms": {k.removeprefix("cpu "): ms(v) for k, v in med.items() if k.startswith("cpu")},
        "cpu_us_per_input": {
            k.removeprefix("cpu "): round(v / n * 1e6, 1)
            for k, v in med.items()
            if k.startswith("cpu")
        },
        "workers_seen": med["workers seen"],
    }


def breakdown(ns: argparse.Namespace, jobs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "path": "run_async_map, the blocking as_completed(), results(cleanup=False), cleanup()",
        "note": (
            "consumer CPU from getrusage (all threads) minus the sampler thread; supervisor "
            "and worker CPU sampled from /proc/<pid>/schedstat every 10 ms (the last few ms of "
            "each process can be missed)"
        ),
    }
    for n in ns.sizes:
        out[str(n)] = breakdown_one(jobs, n, ns.breakdown_runs)
    return out


# ------------------------------------------------------------------------------- report


def print_report(res: dict[str, Any]) -> None:
    tp = res["throughput"]
    for n in tp["sizes"]:
        row = tp["per_size"][str(n)]
        k = tp["runs"] * tp["samples_per_round"][str(n)]
        print(f"\nN = {n:,} (median of {k}: {tp['runs']} interleaved rounds)")
        print(f"  {'contender':<20} {'inputs/s':>10} {'median ms':>11}")
        for name, rate in row["inputs_per_s"].items():
            print(f"  {name:<20} {rate:>10,.0f} {row['wall'][name]['median_ms']:>11,.1f}")
        for name, value in row["ratios"].items():
            print(f"  {name:<34} {value:6.2f}x")
        for name, value in row["verdict"].items():
            print(f"  target {name:<36} {value}")
        for name, s in row["submit_wall"].items():
            print(f"  {name} submission (run_async_map returns): {s['median_ms']:.1f} ms")
    ray = tp["ray"]
    print(
        f"\nray {ray['version']}: ray.init() {ray['init (excluded)']['median_ms']:.0f} ms "
        f"(excluded), import {ray['import']['median_ms']:.0f} ms"
    )
    lat = res["latency"]["first_completion_to_handle"]
    print("\nfirst completion -> handle from as_completed():")
    for name, s in lat.items():
        print(f"  {name:<20} median {s['median_ms']:.2f} ms (min {s['min_ms']:.2f})")
    if "breakdown" in res:
        b = res["breakdown"]
        for n in res["throughput"]["sizes"]:
            row = b[str(n)]
            print(f"\nkinetic breakdown, N = {n:,} (median of {row['runs']}), ms from submission:")
            for k, v in row["timeline_ms_from_submission_start"].items():
                print(f"  {k:<46} {v:9.1f}")
            cpu = row["cpu_ms"]
            per = row["cpu_us_per_input"]
            print("  CPU: " + ", ".join(f"{k} {cpu[k]:.0f} ms ({per[k]} us/input)" for k in cpu))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 1_000])
    parser.add_argument("--runs", type=int, default=3, help="interleaved rounds")
    parser.add_argument(
        "--small-reps", type=int, default=3, help=f"samples per round for N < {SMALL:,}"
    )
    parser.add_argument("--latency-batches", type=int, default=5)
    parser.add_argument("--first-delay", type=float, default=0.3)
    parser.add_argument("--other-delay", type=float, default=0.8)
    parser.add_argument("--breakdown-runs", type=int, default=3, help="0 to skip (c)")
    parser.add_argument("--no-write", action="store_true", help="do not write the JSON")
    ns = parser.parse_args()
    ensure_kinetic_interpreter()

    workdir, _ = isolated_project("kinetic-bench-fanout-", "kfanout_jobs", JOBS_MODULE)
    try:
        jobs = importlib.import_module("kfanout_jobs")
        res: dict[str, Any] = {"machine": machine()}
        steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            ("throughput", lambda: throughput(ns, jobs, workdir)),
            ("latency", lambda: latency(ns, jobs)),
        ]
        if ns.breakdown_runs > 0:
            steps.append(("breakdown", lambda: breakdown(ns, jobs)))
        for name, step in steps:
            print(f"{name} ...", flush=True)
            start = time.perf_counter()
            res[name] = step()
            print(f"  ({time.perf_counter() - start:.0f} s)", flush=True)
        res["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        res["notes"] = [
            "Ratios are throughput ratios (inputs/s) of medians measured in the same run.",
            (
                "kinetic: results durably appended per input to per-worker logs; results() "
                "includes its default cleanup. Ray and the process pool keep nothing durable."
            ),
            "Ray: ray.init() and a 200-task warm-up excluded; the pool's start included.",
        ]
        print_report(res)
        if not ns.no_write:
            print(f"\nwrote {write('fanout', res)}")
    finally:
        os.chdir("/")
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
