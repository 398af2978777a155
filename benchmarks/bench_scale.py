"""Local fan-out at scale: throughput and client memory for 10k, 100k and 1M inputs.

For each code tree (``--tree NAME=PATH``; the working tree as ``now`` by default), size
in ``--sizes`` and ``max_concurrent`` in ``--concurrency`` (``default`` leaves it unset:
one worker per core), one fresh client process runs a trivial function (``x * x``)
through ``square.run_async_map(range(N), max_concurrent=m).results()`` (blocking API,
default cleanup included) and reports:

- ``inputs_per_s``: N / (submission start -> every value in hand);
- ``submit_s``: how long ``run_async_map`` took to return (inputs recorded);
- ``peak_rss_mb``: the client's peak resident memory (``resource.getrusage``), and
  ``rss_growth_mb``, the peak minus what the process held before submitting.

Each configuration runs in its own process (a fresh peak RSS, a private
``KINETIC_LOCAL_ROOT``), after a 1,000-input warm-up in that process. Trees run side
by side in one invocation, so ``--tree before=/path/to/old/checkout`` gives a
before/after comparison on the same machine at the same load. Sizes listed in
``--big`` run once per tree, only with ``--big-concurrency``, under ``--big-timeout``
seconds (the machine is shared: a 1M batch is not repeated).

Usage: ``python benchmarks/bench_scale.py [--tree before=/tmp/old] [--sizes ...]``;
writes ``benchmarks/results/scale.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import REPO, isolated_project, machine, write_results

JOBS_MODULE = '''\
"""Jobs for bench_scale."""
import kinetic


@kinetic.run(accelerator="cpu")
def square(x):
    return x * x
'''

WARMUP = 1_000


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(n: int, concurrency: str) -> None:
    """One configuration, in this (fresh) process; prints one JSON line."""
    import importlib

    workdir, _ = isolated_project("kinetic-bench-scale-", "kscale_jobs", JOBS_MODULE)
    try:
        jobs = importlib.import_module("kscale_jobs")
        import kinetic

        kw: dict[str, Any] = {}
        if concurrency != "default":
            kw["max_concurrent"] = int(concurrency)
        warm = jobs.square.run_async_map(range(WARMUP), **kw).results(timeout=120)
        assert warm == [i * i for i in range(WARMUP)]
        del warm
        from bench_fanout import CpuSampler

        before = _current_rss_mb()
        cpu0 = _cpu()
        start = time.perf_counter()
        batch = jobs.square.run_async_map(range(n), **kw)
        submitted = time.perf_counter()
        cpu1 = _cpu()
        sampler = CpuSampler(batch.aio._backend.batches.group_dir(batch.group_id))
        sampler.start()
        out = batch.results(timeout=3600)
        end = time.perf_counter()
        sampler.stop_flag.set()
        sampler.join(5)
        cpu2 = _cpu() - sampler.own_cpu
        ok = len(out) == n and all(v == i * i for i, v in enumerate(out))
        del out, batch
        peak = _rss_mb()
        print(
            json.dumps(
                {
                    "ok": ok,
                    "kinetic": os.path.dirname(os.path.dirname(kinetic.__file__)),
                    "submit_s": round(submitted - start, 3),
                    "total_s": round(end - start, 3),
                    "inputs_per_s": round(n / (end - start), 1),
                    "results_inputs_per_s": round(n / (end - submitted), 1),
                    "cpu_us_per_input": {
                        "client_submit": round((cpu1 - cpu0) / n * 1e6, 2),
                        "client_results": round((cpu2 - cpu1) / n * 1e6, 2),
                        "supervisor": round(sampler.supervisor / n * 1e6, 2),
                        "workers": round(sum(sampler.workers.values()) / n * 1e6, 2),
                    },
                    "workers_seen": len(sampler.workers),
                    "peak_rss_mb": round(peak, 1),
                    "rss_before_mb": round(before, 1),
                    "rss_growth_mb": round(peak - before, 1),
                }
            ),
            flush=True,
        )
    finally:
        os.chdir("/")
        shutil.rmtree(workdir, ignore_errors=True)


def _kill_leftovers(local_root: Path) -> None:
    """End the supervisors a timed-out client left running (by their recorded pid)."""
    for path in local_root.glob("storage/groups/*/supervisor.json"):
        try:
            pid = int(json.loads(path.read_text())["pid"])
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except (OSError, ValueError, KeyError):
            continue


def run_one(tree: Path, n: int, concurrency: str, timeout: float) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    env.pop("KINETIC_LOCAL_ROOT", None)
    env["TMPDIR"] = env.get("TMPDIR", "/tmp")
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", str(n), concurrency],
        env=env,
        cwd=str(Path(__file__).parent),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        for root in Path(env["TMPDIR"]).glob("kinetic-bench-scale-*/local"):
            _kill_leftovers(root)
        return {"ok": False, "error": f"timed out after {timeout} s"}
    if proc.returncode != 0:
        return {"ok": False, "error": err.decode()[-2000:]}
    return dict(json.loads(out.decode().strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH (repeatable)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--concurrency", nargs="+", default=["1", "2", "default"])
    parser.add_argument("--big", type=int, nargs="*", default=[1_000_000])
    parser.add_argument("--big-concurrency", default="default")
    parser.add_argument("--big-timeout", type=float, default=420.0)
    parser.add_argument("--big-trees", nargs="*", default=[], help="trees that run --big")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument(
        "--results", default="scale", help="results file name (benchmarks/results/NAME.json)"
    )
    ns = parser.parse_args()
    if ns.child:
        child(int(ns.child[0]), ns.child[1])
        return
    trees = {"now": REPO}
    for item in ns.tree:
        name, _, path = item.partition("=")
        trees[name] = Path(path).resolve()
    plan = [(n, c) for n in ns.sizes for c in ns.concurrency]
    plan += [(n, ns.big_concurrency) for n in ns.big]
    res: dict[str, Any] = {"machine": machine(), "trees": {k: str(v) for k, v in trees.items()}}
    rows: dict[str, dict[str, Any]] = {name: {} for name in trees}
    for n, c in plan:
        for name, tree in trees.items():
            if n in ns.big and ns.big_trees and name not in ns.big_trees:
                continue
            timeout = ns.big_timeout if n in ns.big else ns.timeout
            got = run_one(tree, n, c, timeout)
            rows[name][f"{n} mc={c}"] = got
            rate = got.get("inputs_per_s", 0.0)
            cpu = " ".join(f"{k} {v}" for k, v in got.get("cpu_us_per_input", {}).items())
            print(
                f"{name:>8} N={n:>9,} mc={c:<8} {rate:>9,.0f}/s "
                f"(results {got.get('results_inputs_per_s', 0):>9,.0f}/s) "
                f"submit {got.get('submit_s', 0):6.2f} s  peak RSS "
                f"{got.get('peak_rss_mb', 0):6.1f} MB  cpu us/input: {cpu} "
                f"{got.get('error', '')[:300]}",
                flush=True,
            )
    res["results"] = rows
    for name, row in rows.items():
        ratios: dict[str, float] = {}
        for n in ns.big:
            big = row.get(f"{n} mc={ns.big_concurrency}", {}).get("inputs_per_s")
            ref = row.get(f"{max(ns.sizes)} mc={ns.big_concurrency}", {}).get("inputs_per_s")
            if big and ref:
                ratios[f"{n}/{max(ns.sizes)} throughput"] = round(big / ref, 3)
        res.setdefault("scale_ratios", {})[name] = ratios
    res["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(res.get("scale_ratios"), indent=1))
    if not ns.no_write:
        print(f"wrote {write_results(ns.results, res)}")


if __name__ == "__main__":
    main()
