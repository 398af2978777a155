"""The two pool engines' production code side by side, as real processes on this machine.

The same batch (``--inputs`` inputs that sleep ``--input-ms`` each, a fork per input),
recorded on a directory store (``file://``: the stores' semantics, none of GCS's
latency or rate limits: ``bench_pool_sim.py`` models those), run by

* **leaderless**: ``--workers`` worker processes (``python -m runner.pool``), claiming
  spans and writing bursts in storage;
* **coordinated**: a coordinator process (``python -m runner.pool.coordinator``, on
  loopback) and as many worker processes with the batch's token.

For each, over ``--runs`` repetitions: wall time from the processes' start to the last
one's exit against the ideal (``inputs x input / workers``), and the objects the run
created in storage per input (claims, bursts, holes; commits, coordinator records).
Every value is checked: each input has exactly one reported outcome and it is right.
Writes ``benchmarks/results/pool_engines.json``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import REPO, machine, write_results

WORKER = [sys.executable, "-m", "runner.pool"]
COORDINATOR = [sys.executable, "-m", "runner.pool.coordinator"]


def pause(ms: int) -> int:
    time.sleep(ms / 1000)
    return ms


def run_once(engine: str, inputs: int, workers: int, input_ms: int) -> dict[str, Any]:
    from runner.pool.coordinator import wire
    from tests.local.test_pool_worker import GID, record

    with tempfile.TemporaryDirectory(prefix="kinetic-bench-pool-") as tmp:
        root = Path(tmp)
        record(root, pause, [((input_ms,), {}) for _ in range(inputs)], max_concurrent=workers)
        before = set(_objects(root))
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        storage = ["--storage", f"file://{root}", "--group", GID]
        if engine == "coordinated":
            env[wire.TOKEN_ENV] = secrets.token_hex(32)
        started = time.monotonic()
        procs = [
            subprocess.Popen(
                [*WORKER, *storage],
                env={**env, "KINETIC_WORKER": f"w{k}"},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
            for k in range(workers)
        ]
        if engine == "coordinated":
            procs.append(
                subprocess.Popen(
                    [*COORDINATOR, *storage, "--host", "127.0.0.1"],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.STDOUT,
                )
            )
        for proc in procs:
            if proc.wait(timeout=600) != 0:
                raise SystemExit(f"{engine}: a process exited {proc.returncode}")
        wall = time.monotonic() - started
        created = set(_objects(root)) - before
        _check(root, GID, inputs, input_ms)
    ideal = inputs * input_ms / 1000 / workers
    return {
        "wall_s": round(wall, 3),
        "ideal_s": round(ideal, 3),
        "ratio": round(wall / ideal, 3),
        "objects_per_input": round(len(created) / inputs, 4),
    }


def _objects(root: Path) -> list[str]:
    return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()]


def _check(root: Path, group_id: str, inputs: int, input_ms: int) -> None:
    """Each input has one reported outcome (the earliest record), and it is right."""
    import cloudpickle

    from runner import protocol, results_log
    from runner.pool.coordinator import commits
    from runner.store import FileStore

    store = FileStore(root)
    found: dict[int, Any] = {}
    for prefix in (commits.commits_prefix(group_id), protocol.group_bursts_prefix(group_id)):
        for key in sorted(store.list(prefix)):
            for index, _, payload in results_log.decode_burst(store.read(key)):
                found.setdefault(index, cloudpickle.loads(payload)["result"])
    if sorted(found) != list(range(inputs)) or set(found.values()) != {input_ms}:
        raise SystemExit(f"{len(found)} of {inputs} outcomes, or a wrong value")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=800)
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--input-ms", type=int, default=50)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rows: dict[str, Any] = {}
    for workers in args.workers:
        for engine in ("leaderless", "coordinated"):
            runs = [run_once(engine, args.inputs, workers, args.input_ms) for _ in range(args.runs)]
            ratios = [r["ratio"] for r in runs]
            row = {
                "engine": engine,
                "workers": workers,
                "inputs": args.inputs,
                "input_ms": args.input_ms,
                "median_ratio": round(statistics.median(ratios), 3),
                "ratios": ratios,
                "median_wall_s": round(statistics.median(r["wall_s"] for r in runs), 3),
                "ideal_s": runs[0]["ideal_s"],
                "objects_per_input": runs[0]["objects_per_input"],
            }
            rows[f"{engine}_{workers}"] = row
            print(
                f"{engine:>11} x{workers}: {row['median_wall_s']:.2f} s "
                f"({row['median_ratio']:.2f}x of {row['ideal_s']:.1f} s), "
                f"{row['objects_per_input']:.3f} objects/input",
                flush=True,
            )
    write_results("pool_engines", {"machine": machine(), "args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
