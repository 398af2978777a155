"""aiohttp versus httpx, the two HTTP stacks Kinetic once carried (``docs/architecture.md``,
"Dependencies" and "One HTTP edge"): what a second stack would cost.

- requests: 2,000 small GETs (a 60-byte JSON answer) to a loopback aiohttp server on
  127.0.0.1 (in a process of its own), each client over one keep-alive pool: one at a
  time, and 16 in flight. Each round runs both clients, in alternating order; the figure
  is the median over the rounds;
- imports: net wall time of ``import aiohttp`` and ``import httpx`` in fresh
  interpreters (minus ``python -c pass``), and what ``import httpx`` adds where aiohttp
  is already imported (gcloud-aio-storage requires aiohttp, so Kinetic loads it anyway):
  its time and its number of modules.

Usage: ``.venv/bin/python benchmarks/bench_http_clients.py [--rounds 5] [--requests 2000]``
(httpx comes with the ``bench`` extra). 1-2 minutes on 2 cores. Writes
``benchmarks/results/http_clients.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from _common import machine, median, ms, summary, time_subprocess, write_results

SERVER = """
import asyncio
from aiohttp import web

async def answer(request):
    return web.json_response({"kind": "storage#object", "name": "k", "size": "3"})

async def main():
    app = web.Application()
    app.router.add_get("/o", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    print(runner.addresses[0][1], flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""

IN_FLIGHT = 16


def start_server() -> tuple[subprocess.Popen[str], str]:
    """The loopback server in a process of its own (its own interpreter lock), and its
    URL."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL
    )
    assert proc.stdout is not None
    port = proc.stdout.readline().strip()
    if not port:
        proc.kill()
        raise RuntimeError("the loopback server did not start")
    return proc, f"http://127.0.0.1:{port}/o"


async def spread(n: int, in_flight: int, get: Callable[[], Awaitable[None]]) -> float:
    """Seconds to make ``n`` calls of ``get``, ``in_flight`` at a time."""
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await get()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return time.perf_counter() - started


async def with_aiohttp(url: str, n: int, in_flight: int) -> float:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=in_flight)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def get() -> None:
            async with session.get(url) as resp:
                resp.raise_for_status()
                await resp.json()

        await get()  # the pool's first connection, outside the timing
        return await spread(n, in_flight, get)


async def with_httpx(url: str, n: int, in_flight: int) -> float:
    import httpx

    limits = httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight)
    async with httpx.AsyncClient(limits=limits) as client:

        async def get() -> None:
            resp = await client.get(url)
            resp.raise_for_status()
            resp.json()

        await get()
        return await spread(n, in_flight, get)


CLIENTS = {"aiohttp": with_aiohttp, "httpx": with_httpx}


def requests(url: str, n: int, rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for in_flight in (1, IN_FLIGHT):
        samples: dict[str, list[float]] = {name: [] for name in CLIENTS}
        for r in range(rounds):
            order = list(CLIENTS) if r % 2 == 0 else list(reversed(CLIENTS))
            for name in order:
                samples[name].append(asyncio.run(CLIENTS[name](url, n, in_flight)))
        row = {name: summary(s) for name, s in samples.items()}
        for name, s in samples.items():
            row[name]["us_per_request"] = round(median(s) / n * 1e6, 1)
        row["httpx_over_aiohttp"] = round(median(samples["httpx"]) / median(samples["aiohttp"]), 2)
        out[f"in_flight_{in_flight}"] = row
    return out


def clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONSTARTUP", "PYTHONPROFILEIMPORTTIME"):
        env.pop(name, None)
    return env


def imports(rounds: int) -> dict[str, Any]:
    codes = {
        "pass": "pass",
        "aiohttp": "import aiohttp",
        "httpx": "import httpx",
        "aiohttp+httpx": "import aiohttp, httpx",
    }
    env = clean_env()
    samples: dict[str, list[float]] = {name: [] for name in codes}
    for _ in range(rounds):
        for name, code in codes.items():
            samples[name].append(time_subprocess([sys.executable, "-c", code], cwd="/", env=env))
    base = median(samples["pass"])
    net = {name: ms(median(s) - base) for name, s in samples.items() if name != "pass"}
    count = (
        "import sys, aiohttp; a = set(sys.modules); import httpx; print(len(set(sys.modules) - a))"
    )
    added = subprocess.run(
        [sys.executable, "-c", count], env=env, capture_output=True, text=True, check=True
    )
    return {
        "net_import_ms": net,
        "httpx_beside_aiohttp_ms": round(net["aiohttp+httpx"] - net["aiohttp"], 3),
        "httpx_beside_aiohttp_modules": int(added.stdout),
        "rounds": rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    import aiohttp
    import httpx

    server, url = start_server()
    try:
        measured = requests(url, args.requests, args.rounds)
    finally:
        server.terminate()
        server.wait(timeout=10)
    data = {
        "what": "aiohttp vs httpx: small GETs to a loopback server, and import cost",
        "machine": machine(),
        "versions": {"aiohttp": aiohttp.__version__, "httpx": httpx.__version__},
        "requests_per_run": args.requests,
        "requests": measured,
        "imports": imports(args.rounds * 2),
    }
    path = write_results("http_clients", data)
    for key, row in measured.items():
        print(
            f"{key}: aiohttp {row['aiohttp']['us_per_request']} us/request, "
            f"httpx {row['httpx']['us_per_request']} us/request "
            f"({row['httpx_over_aiohttp']}x)"
        )
    print(f"imports: {data['imports']}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
