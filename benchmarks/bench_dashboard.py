"""The dashboard at 100,000 inputs: refresh time and storage reads per refresh.

A real local batch of ``--inputs`` trivial inputs (100,000; every 1,000th raises) is
submitted with ``kinetic.aio`` and run by the local supervisor: nothing is constructed
by hand. While it runs, and after, the dashboard's batch watch (the object every page
and event stream of one batch shares) refreshes once a second, as a page does:

- ``followed`` (what the dashboard does): the watch follows the supervisor's event
  stream, so a refresh reads nothing while it runs; ``snapshots_only`` (as on GKE, or
  with no task group to follow in): each refresh takes the engine's snapshot. For each:
  ``running``, refreshes while inputs finish; ``running_nothing_new``, refreshes while
  only the last 4 inputs (which sleep 15 s) run; ``process_reads_per_s``, all the
  process read meanwhile (the follower's socket included);
- ``cold``: a dashboard started after the batch ended (a fresh backend object, so
  nothing of the results logs is cached): its first refresh reads the records once;
- ``steady``: the refreshes after it (nothing new: what a page costs to keep open).

Per refresh it reports the wall time, the calls into the async core that read the
batch's records (``reads``: snapshot, load_many of newly failed inputs, stop record;
never one per input), and what the process read from the kernel meanwhile
(``/proc/self/io``: read syscalls and bytes, sockets included). It also times the HTTP
pages a browser asks for, through the real server: the batch page (first region and a
region at input 50,000), an input's page, and the batch's first server-sent event.

Usage: ``.venv/bin/python benchmarks/bench_dashboard.py [--inputs N]``. Writes
``benchmarks/results/dashboard.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import isolated_project, machine, ms, summary, write_results

_MODULE = """
import os, time

SLOW_FROM = int(os.environ["BENCH_DASH_SLOW_FROM"])

def square(x):
    if x >= SLOW_FROM:  # the last few inputs run a while: a batch that is still running
        time.sleep(float(os.environ["BENCH_DASH_SLOW_S"]))
    if x % 1000 == 7:
        raise ValueError(f"input {x} is unlucky")
    return x * x
"""
_SLOW = 4  # inputs at the end that sleep
_SLOW_S = 15.0


def _io() -> tuple[int, int]:
    """(read syscalls, bytes read) of this process so far."""
    fields = dict(
        line.split(": ") for line in Path("/proc/self/io").read_text().splitlines() if ": " in line
    )
    return int(fields["syscr"]), int(fields["rchar"])


async def _refresh(watch: Any) -> dict[str, float]:
    reads, (calls, chars) = watch.reads, _io()
    start = time.perf_counter()
    await watch.refresh(force=True)
    took = time.perf_counter() - start
    after_calls, after_chars = _io()
    return {
        "s": took,
        "reads": watch.reads - reads,
        "syscalls": after_calls - calls,
        "bytes": after_chars - chars,
    }


def _report(rows: list[dict[str, float]]) -> dict[str, Any]:
    if not rows:
        return {"n": 0}
    return {
        "refresh": summary([r["s"] for r in rows]),
        "reads_per_refresh_max": max(r["reads"] for r in rows),
        "reads_per_refresh_median": sorted(r["reads"] for r in rows)[len(rows) // 2],
        "read_syscalls_per_refresh_max": max(r["syscalls"] for r in rows),
        "bytes_read_per_refresh_max": max(r["bytes"] for r in rows),
        "bytes_read_per_refresh_median": sorted(r["bytes"] for r in rows)[len(rows) // 2],
    }


async def _get(port: int, path: str, token: str) -> tuple[float, int, int]:
    """Seconds to the whole answer, its status, its size (one plain HTTP/1.1 request)."""
    import anyio

    start = time.perf_counter()
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        sep = "&" if "?" in path else "?"
        await stream.send(
            f"GET {path}{sep}t={token} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
        )
        data = b""
        while True:
            try:
                data += await stream.receive(1 << 16)
            except anyio.EndOfStream:
                break
            if path.endswith("/events") and b"\n\n" in data.partition(b"\r\n\r\n")[2]:
                break
    return time.perf_counter() - start, int(data.split(b" ", 2)[1]), len(data)


async def main(n: int) -> dict[str, Any]:
    import anyio
    from square_mod import square  # type: ignore[import-not-found]

    import kinetic
    from kinetic._backends.local import LocalBackend
    from kinetic._dashboard import serve
    from kinetic._dashboard.source import Source
    from kinetic._engine import runtime
    from kinetic._settings import load_settings

    fn = kinetic.aio.run()(square)
    settings = load_settings()
    backend = runtime.backend_for_settings(settings)

    async def watch_a_run(follow: bool) -> dict[str, Any]:
        """Submit a batch and refresh its watch every 0.25 s until it ends."""
        start = time.perf_counter()
        batch = await fn.run_async_map(range(n))
        submitted = time.perf_counter() - start
        running: list[dict[str, float]] = []
        waiting: list[dict[str, float]] = []  # only the slow inputs left: nothing new
        lag = [0.0]

        async def probe() -> None:  # how late a 5 ms sleep wakes: the loop's longest stall
            while True:
                before = time.perf_counter()
                await anyio.sleep(0.005)
                lag[0] = max(lag[0], time.perf_counter() - before - 0.005)

        io_before, began = _io(), time.perf_counter()
        async with anyio.create_task_group() as tg:
            tg.start_soon(probe)
            watch = await Source(backend, tg if follow else None).batch(batch.group_id)
            while not watch.progress.finished:
                p = watch.progress
                rows = waiting if p.succeeded + p.failed >= n - _SLOW else running
                rows.append(await _refresh(watch))
                await anyio.sleep(0.25)  # a page refreshes once a second; more samples here
            tg.cancel_scope.cancel()
        io_after, took = _io(), time.perf_counter() - began
        assert watch.progress.failed == n // 1000, watch.progress.failed
        return {
            "group_id": batch.group_id,
            "submit_s": round(submitted, 3),
            "submit_to_done_s": round(time.perf_counter() - start, 3),
            "running": {
                **_report(running),
                "refreshes": len(running),
                "loop_stall_max_ms": ms(lag[0]),
            },
            "running_nothing_new": _report(waiting),
            "process_reads_per_s": {  # everything this process read meanwhile
                "syscalls": round((io_after[0] - io_before[0]) / took),
                "bytes": round((io_after[1] - io_before[1]) / took),
            },
        }

    followed = await watch_a_run(follow=True)
    snapshots = await watch_a_run(follow=False)
    batch_id = followed["group_id"]
    await anyio.sleep(1.0)  # the supervisors exit

    # A dashboard started afterwards: nothing cached.
    cold_source = Source(LocalBackend(Path(settings.local_root)))
    cold_watch = await cold_source.batch(batch_id)
    cold = [await _refresh(cold_watch)]
    assert cold_watch.progress.finished
    steady = [await _refresh(cold_watch) for _ in range(20)]

    pages: dict[str, Any] = {}
    async with anyio.create_task_group() as tg:
        dash = await tg.start(serve)
        g = batch_id
        for name, path in (
            ("jobs", "/"),
            ("batch_page", f"/batches/{g}"),
            ("batch_page_region_50000", f"/batches/{g}?offset=50000"),
            ("input_page", f"/batches/{g}/inputs/7"),
            ("batch_first_event", f"/batches/{g}/events"),
        ):
            times, size, status = [], 0, 0
            for _ in range(5):
                took, status, size = await _get(dash.port, path, dash.token)
                times.append(took)
            assert status == 200, (path, status)
            pages[name] = {**summary(times), "bytes": size}
        denied = await _get(dash.port, "/", "wrong")
        assert denied[1] == 403
        tg.cancel_scope.cancel()
    return {
        "inputs": n,
        "failed_inputs": n // 1000,
        "note": (
            "real batches run by the local supervisor; the last "
            f"{_SLOW} inputs sleep {_SLOW_S}s (running_nothing_new: a page kept open on a "
            "running batch in which nothing changes); reads = calls into the async core "
            "that read the batch's records; syscalls/bytes from /proc/self/io (sockets "
            "included)"
        ),
        "followed": followed,
        "snapshots_only": snapshots,
        "cold_first_refresh": {
            "ms": ms(cold[0]["s"]),
            "reads": cold[0]["reads"],
            "bytes": cold[0]["bytes"],
        },
        "steady": _report(steady),
        "pages": pages,
    }


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=100_000)
    args = parser.parse_args()
    os.environ["BENCH_DASH_SLOW_FROM"] = str(args.inputs - _SLOW)
    os.environ["BENCH_DASH_SLOW_S"] = str(_SLOW_S)
    workdir, _project = isolated_project("kn-bench-dash-", "square_mod", _MODULE)
    try:
        data = asyncio.run(main(args.inputs))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    data["machine"] = machine()
    path = write_results("dashboard", data)
    print(f"wrote {path}")
    for mode in ("followed", "snapshots_only"):
        for key in ("running", "running_nothing_new", "process_reads_per_s"):
            print(mode, key, data[mode][key])
    for key in ("cold_first_refresh", "steady"):
        print(key, data[key])
    print("pages", {k: v["median_ms"] for k, v in data["pages"].items()})


if __name__ == "__main__":
    cli()
