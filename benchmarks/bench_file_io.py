"""Why Kinetic does its file IO with ``anyio.to_thread`` and not ``aiofiles``.

Both move blocking file calls off the event loop into worker threads. ``aiofiles`` does
it per call (``open``, each ``read``/``write``, ``close``: a thread hop each), where
Kinetic runs one whole operation (open, read everything, close; or a batch of small
records) in one worker-thread call. Measured side by side in one run, interleaved:

- a 4 MiB file read in 64 KiB chunks (how a stream copy reads), and
- 200 small JSON records (a batch's handles, a job's records) read one file each.

Usage: ``python benchmarks/bench_file_io.py [--rounds 7]``. Writes
``benchmarks/results/file_io.json``. ``aiofiles`` comes with gcloud-aio-storage.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiofiles
import anyio
import anyio.to_thread
from _common import machine, median
from _common import write_results as write

CHUNK = 64 * 1024


async def _aiofiles_big(path: Path) -> int:
    size = 0
    async with aiofiles.open(path, "rb") as f:
        while chunk := await f.read(CHUNK):
            size += len(chunk)
    return size


def _read_chunked(path: Path) -> int:
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            size += len(chunk)
    return size


async def _thread_big(path: Path) -> int:
    return await anyio.to_thread.run_sync(_read_chunked, path)


async def _aiofiles_small(paths: list[Path]) -> int:
    total = 0
    for path in paths:
        async with aiofiles.open(path, "rb") as f:
            total += len(json.loads(await f.read()))
    return total


async def _thread_small(paths: list[Path]) -> int:
    def read_all() -> int:
        return sum(len(json.loads(p.read_bytes())) for p in paths)

    return await anyio.to_thread.run_sync(read_all)


async def _time(fn: Callable[[], Awaitable[int]]) -> float:
    start = time.perf_counter()
    await fn()
    return time.perf_counter() - start


async def main(rounds: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "big.bin"
        big.write_bytes(b"x" * (4 * 1024 * 1024))
        small = [Path(tmp) / f"r{i}.json" for i in range(200)]
        for path in small:
            path.write_text(json.dumps({"job_id": path.stem, "status": "SUCCEEDED"}))
        cases: dict[str, Callable[[], Awaitable[int]]] = {
            "big_aiofiles": lambda: _aiofiles_big(big),
            "big_to_thread": lambda: _thread_big(big),
            "small_aiofiles": lambda: _aiofiles_small(small),
            "small_to_thread": lambda: _thread_small(small),
        }
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(rounds):
            for name, fn in cases.items():
                times[name].append(await _time(fn))
    result: dict[str, object] = {name: median(t) * 1000 for name, t in times.items()}
    result["big_ratio"] = median(times["big_aiofiles"]) / median(times["big_to_thread"])
    result["small_ratio"] = median(times["small_aiofiles"]) / median(times["small_to_thread"])
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    found = anyio.run(main, args.rounds)
    for key, value in found.items():
        print(f"{key:>16}: {value:.2f}" + (" ms" if not key.endswith("ratio") else "x"))
    write("file_io", {"machine": machine(), "rounds": args.rounds, "results": found})
