"""A loopback rate limiter in front of fake-gcs-server, with GCS's documented starting rates.

Run as ``python benchmarks/gcs_limiter.py --upstream http://127.0.0.1:PORT`` (it prints
``listening http://127.0.0.1:PORT`` once it serves); clients point
``STORAGE_EMULATOR_HOST`` at it. It listens on 127.0.0.1 only and stops by itself after
``--lifetime`` seconds (or on SIGTERM).

Several ``--upstream`` servers make one bucket between them, each object on the server
its name hashes to. That is for capacity: fake-gcs-server's memory backend keeps a
bucket's objects in a list, so each request costs in proportion to the objects in the
bucket (45 writes/s at 8,000 objects), and it answers a listing with every object's full
metadata whatever ``fields`` asks (a page of 1,000 claims is ~0.5 MB to parse). The
bucket must be created on every server. Listings are then answered by the limiter from
the names it saw created (it forwards every write and deletion, and records the name
once the server answered 2xx, before the client hears back: a listing sees every write
that completed, as GCS's strongly consistent listings do): names only, in order, paged
by the last name returned, ``delimiter`` not supported.

What it enforces (Cloud Storage's "Request rate and access distribution guidelines" and
quotas page: a bucket starts at about 1,000 object writes and 5,000 object reads per
second and ramps up from there over minutes, which a short run never sees; one object
name takes about one write per second), each a token bucket:

* **writes per bucket** (uploads, deletions, patches), ``--write-rate`` per second;
* **reads per bucket** (downloads, metadata, listings), ``--read-rate`` per second;
* **writes per object name**, ``--object-rate`` per second: a write or deletion is
  refused while the name's last change is too recent; only a change (an answer 2xx)
  spends the name's token. A create-if-absent (``ifGenerationMatch=0``) is never
  refused for its name: it can change a name once, and otherwise fails (412).

A bucket's burst is ``--burst`` seconds of its rate (0.05 s by default: 50 writes, 250
reads), so that no second passes more than the rate and that burst (1,050 writes at
most, not the 2,000 a burst of a whole second let through); an object name's is one
write. Past a limit the request is answered ``429`` with a GCS-style JSON error, without
reaching fake-gcs-server; a refused request takes no token. A listing is enforced as a
read (the rate guidelines count it with reads) though GCS bills it as a Class A
operation, with writes: the reports count it with writes.

**Latency.** Each request waits ``--latency-ms LO HI`` (uniform; GCS's 30–80 ms
scaled by the caller's dilation), half on its way in and half on its way back. A client
that drops its connection on the way in (a pod killed during a write) reaches nothing:
the request is counted ``cut`` and never applied; one that drops it on the way back
has its write applied and never hears of it (counted ``unanswered``). The time from
arrival to answer of each request is kept as a histogram in whole milliseconds
(``latency_ms``), and so is the time each outcome object landed (``landed``: name ->
wall-clock time; bursts, commits and outcomes only).

Every request is counted by *kind* (``create`` = an upload with ``ifGenerationMatch=0``,
``write`` = any other upload, ``read``, ``stat``, ``list``, ``delete``) and *area* (the
first path segment after ``_groups/{group}/``: ``claims``, ``results``, ``inputs``,
``manifest.json`` …, or what a listing's prefix names), with the status it got. The
counts, the 429s by limit, and the accepted writes and reads of each second are served
at ``GET /_limiter/stats``; ``POST /_limiter/reset`` zeroes them, and with
``?limits=off`` lets every request through uncounted until the next reset (to set up a
run and to check it afterwards); ``GET /_limiter/names?bucket=B&prefix=P`` lists the names it
saw created (several upstreams only), uncounted.

A benchmark tool, not part of Kinetic.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import random
import re
import signal
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import aiohttp
from aiohttp import web

_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "host", "content-length", "upgrade"}
)
_NAME_IN_METADATA = re.compile(rb'"name":\s*"((?:[^"\\]|\\.)*)"')
_OBJECT_PATH = re.compile(r"^/(?:download/)?storage/v1/b/([^/]+)/o/(.+)$")
_OBJECTS_PATH = re.compile(r"^/(?:upload/)?storage/v1/b/([^/]+)/o/?$")


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` held."""

    __slots__ = ("burst", "level", "rate", "stamp")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.level, self.stamp = rate, burst, burst, now

    def take(self, now: float) -> bool:
        self.level = min(self.burst, self.level + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.level >= 1.0:
            self.level -= 1.0
            return True
        return False


@dataclass
class Limits:
    write_rate: float = 1000.0
    read_rate: float = 5000.0
    object_rate: float = 1.0
    burst_s: float = 0.05
    latency_s: tuple[float, float] = (0.0, 0.0)
    """A request's latency, uniform between the two (half in, half back)."""


@dataclass
class Tally:
    """What the limiter saw (see the module docstring)."""

    started: float = field(default_factory=time.monotonic)
    cpu_at_start: float = field(default_factory=time.process_time)
    last_outcome: float = 0.0
    """Wall-clock time of the last outcome written (areas ``bursts``, ``results`` and ``commits``)."""
    requests: Counter[str] = field(default_factory=Counter)
    """``"kind area status"`` -> count."""
    refused: Counter[str] = field(default_factory=Counter)
    """limit (``bucket-writes``, ``bucket-reads``, ``object-writes``) -> 429s."""
    writes_per_s: Counter[int] = field(default_factory=Counter)
    reads_per_s: Counter[int] = field(default_factory=Counter)
    refused_per_s: Counter[int] = field(default_factory=Counter)
    latency_ms: Counter[int] = field(default_factory=Counter)
    """Arrival to answer of each request, whole milliseconds -> count."""
    landed: dict[str, float] = field(default_factory=dict)
    """Outcome objects (bursts, outcomes of their own) -> wall-clock time they landed."""
    cut: Counter[str] = field(default_factory=Counter)
    """Requests whose client left on the way in (never applied), ``kind area``."""
    unanswered: Counter[str] = field(default_factory=Counter)
    """Requests applied whose client left before the answer, ``kind area``."""

    def as_json(self) -> dict[str, Any]:
        return {
            "seconds": time.monotonic() - self.started,
            "cpu_s": time.process_time(),
            "cpu_s_at_reset": self.cpu_at_start,
            "last_outcome_wall": self.last_outcome,
            "requests": dict(self.requests),
            "refused": dict(self.refused),
            "writes_per_s": _series(self.writes_per_s),
            "reads_per_s": _series(self.reads_per_s),
            "refused_per_s": _series(self.refused_per_s),
            "latency_ms": {str(k): v for k, v in sorted(self.latency_ms.items())},
            "landed": self.landed,
            "cut": dict(self.cut),
            "unanswered": dict(self.unanswered),
        }


def _series(counts: Counter[int]) -> list[int]:
    return [counts.get(s, 0) for s in range(max(counts, default=-1) + 1)]


def area_of(name: str) -> str:
    """The part of an object name (or a listing's prefix) the report groups by."""
    parts = name.split("/")
    if len(parts) >= 3 and parts[0] == "_groups":
        return parts[2] or "(group)"
    return parts[0] if len(parts) > 1 else "(top)"


class Limiter:
    """The limiter's state and request handler (one per process)."""

    def __init__(self, upstreams: list[str], limits: Limits) -> None:
        self.upstreams, self.limits = [u.rstrip("/") for u in upstreams], limits
        self.enforcing = True
        self._names: dict[str, list[str]] = {}
        """Per bucket, the sorted names of its objects (with several upstreams)."""
        self.tally = Tally()
        self._buckets: dict[tuple[str, str], TokenBucket] = {}
        self._objects: dict[tuple[str, str], TokenBucket] = {}
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=512, force_close=False),
            timeout=aiohttp.ClientTimeout(total=60),
            auto_decompress=False,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _bucket(self, bucket: str, what: str, now: float) -> TokenBucket:
        found = self._buckets.get((bucket, what))
        if found is None:
            rate = self.limits.write_rate if what == "w" else self.limits.read_rate
            found = self._buckets[(bucket, what)] = TokenBucket(
                rate, max(1.0, rate * self.limits.burst_s), now
            )
        return found

    def _admit(self, bucket: str, kind: str, name: str | None, now: float) -> str | None:
        """None when the request may pass, else the limit it is past."""
        write = kind in ("create", "write", "delete")
        creates = kind == "create"  # if absent: once per name, it can only fail (412)
        if (
            write
            and not creates
            and name is not None
            and self._object(bucket, name, now).level < 1.0
        ):
            return "object-writes"
        if write:
            return None if self._bucket(bucket, "w", now).take(now) else "bucket-writes"
        return None if self._bucket(bucket, "r", now).take(now) else "bucket-reads"

    def _object(self, bucket: str, name: str, now: float) -> TokenBucket:
        """The object name's bucket, refilled to ``now``."""
        found = self._objects.get((bucket, name))
        if found is None:
            found = self._objects[(bucket, name)] = TokenBucket(self.limits.object_rate, 1.0, now)
        found.level = min(found.burst, found.level + (now - found.stamp) * found.rate)
        found.stamp = now
        return found

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/_limiter/"):
            return await self._control(request)
        body = await request.read()
        kind, bucket, name = classify(request.method, request.path, request.query, body)
        area = area_of(name) if name is not None else "-"
        arrived = time.monotonic()
        lo, hi = self.limits.latency_s
        latency = random.uniform(lo, hi) if hi > 0 and self.enforcing else 0.0
        if latency:
            await asyncio.sleep(latency / 2)  # on its way in
            transport = request.transport
            if transport is None or transport.is_closing():  # its client is gone
                self.tally.cut[f"{kind} {area}"] += 1
                return web.Response(status=499)
        answer = await self._admitted(request, body, kind, bucket, name, area)
        if latency:
            await asyncio.sleep(latency / 2)  # on its way back
            transport = request.transport
            if (transport is None or transport.is_closing()) and answer.status < 300:
                self.tally.unanswered[f"{kind} {area}"] += 1
        if self.enforcing and bucket is not None:
            self.tally.latency_ms[round((time.monotonic() - arrived) * 1000)] += 1
        return answer

    async def _admitted(
        self,
        request: web.Request,
        body: bytes,
        kind: str,
        bucket: str | None,
        name: str | None,
        area: str,
    ) -> web.StreamResponse:
        """Admit the request by the limits, then forward it (or answer 429)."""
        now = time.monotonic()
        second = int(now - self.tally.started)
        limit = None
        if bucket is not None and kind != "other" and self.enforcing:
            write = kind in ("create", "write", "delete")
            limit = self._admit(bucket, kind, name, now)
            if limit is None:
                (self.tally.writes_per_s if write else self.tally.reads_per_s)[second] += 1
        if limit is not None:
            self.tally.refused[limit] += 1
            self.tally.refused_per_s[second] += 1
            self.tally.requests[f"{kind} {area} 429"] += 1
            return web.json_response(
                {"error": {"code": 429, "message": f"rate limit: {limit} (loopback limiter)"}},
                status=429,
            )
        return await self._forward(request, body, kind, bucket, name, area)

    def _upstream(self, name: str | None) -> str:
        if name is None or len(self.upstreams) == 1:
            return self.upstreams[0]
        return self.upstreams[zlib.crc32(name.encode()) % len(self.upstreams)]

    async def _forward(
        self,
        request: web.Request,
        body: bytes,
        kind: str,
        bucket: str | None,
        name: str | None,
        area: str,
    ) -> web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        if kind == "list" and len(self.upstreams) > 1:
            status, data, out_headers = self._listing(bucket or "", request.query)
        else:
            async with self._session.request(
                request.method,
                self._upstream(name) + request.rel_url.raw_path_qs,
                headers=headers,
                data=body or None,
            ) as upstream:
                status = upstream.status
                data = await upstream.read()
                out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
        if status < 300 and name is not None and len(self.upstreams) > 1:
            self._note(bucket or "", name, kind)
        if self.enforcing:
            self.tally.requests[f"{kind} {area} {status}"] += 1
            if (
                status < 300
                and kind in ("create", "write")
                and area in ("bursts", "results", "commits")
            ):
                self.tally.last_outcome = time.time()
                if name is not None:
                    self.tally.landed.setdefault(name, self.tally.last_outcome)
            if status < 300 and name is not None and kind in ("create", "write", "delete"):
                # A mutation spends the name's token (a failed precondition changes nothing).
                self._object(bucket or "", name, time.monotonic()).level -= 1.0
        return web.Response(status=status, body=data, headers=out_headers)

    def _note(self, bucket: str, name: str, kind: str) -> None:
        """Keep the bucket's names up to date after a successful request."""
        names = self._names.setdefault(bucket, [])
        at = bisect.bisect_left(names, name)
        present = at < len(names) and names[at] == name
        if kind in ("create", "write") and not present:
            names.insert(at, name)
        elif kind == "delete" and present:
            del names[at]

    def _listing(self, bucket: str, query: Any) -> tuple[int, bytes, dict[str, str]]:
        """One page of names under ``prefix`` after ``pageToken`` (the last name sent)."""
        names = self._names.get(bucket, [])
        prefix = query.get("prefix", "")
        size = int(query.get("maxResults", "1000"))
        after = query.get("pageToken", "")
        at = bisect.bisect_right(names, after) if after else bisect.bisect_left(names, prefix)
        page: list[str] = []
        while at < len(names) and len(page) <= size and names[at].startswith(prefix):
            page.append(names[at])
            at += 1
        out: dict[str, Any] = {
            "kind": "storage#objects",
            "items": [{"name": n} for n in page[:size]],
        }
        if len(page) > size:
            out["nextPageToken"] = page[size - 1]
        return 200, json.dumps(out).encode(), {"Content-Type": "application/json"}

    async def _control(self, request: web.Request) -> web.Response:
        if request.path == "/_limiter/stats":
            return web.json_response(self.tally.as_json())
        if request.path == "/_limiter/names":  # uncounted: a benchmark watching its run
            names = self._names.get(request.query.get("bucket", ""), [])
            prefix = request.query.get("prefix", "")
            at = bisect.bisect_left(names, prefix)
            found = []
            while at < len(names) and names[at].startswith(prefix):
                found.append(names[at])
                at += 1
            return web.json_response(found)
        if request.path == "/_limiter/reset" and request.method == "POST":
            self.enforcing = request.query.get("limits") != "off"
            self.tally = Tally()
            self._buckets.clear()
            self._objects.clear()
            return web.json_response({"reset": True})
        return web.json_response({"error": "unknown"}, status=404)


def classify(method: str, path: str, query: Any, body: bytes) -> tuple[str, str | None, str | None]:
    """``(kind, bucket, object name or listing prefix)`` of one JSON API request."""
    match = _OBJECT_PATH.match(path)
    if match is not None:
        bucket, name = match.group(1), unquote(match.group(2))
        if method == "DELETE":
            return "delete", bucket, name
        if method == "GET":
            return ("read" if query.get("alt") == "media" else "stat"), bucket, name
        return "write", bucket, name  # PATCH, PUT: metadata updates are writes
    match = _OBJECTS_PATH.match(path)
    if match is not None:
        bucket = match.group(1)
        if method == "GET":
            return "list", bucket, query.get("prefix", "")
        if method == "POST":
            name = query.get("name")
            if name is None:  # a multipart upload: the name is in the metadata part
                found = _NAME_IN_METADATA.search(body[:4096])
                name = json.loads(b'"' + found.group(1) + b'"') if found else None
            kind = "create" if query.get("ifGenerationMatch") == "0" else "write"
            return kind, bucket, name
    return "other", None, None


async def serve(upstreams: list[str], limits: Limits, port: int, lifetime: float) -> None:
    limiter = Limiter(upstreams, limits)
    await limiter.start()
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", limiter.handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=4096)
    await site.start()
    server = site._server
    assert server is not None
    bound = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"listening http://127.0.0.1:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    try:
        await asyncio.wait_for(stop.wait(), lifetime)
    except TimeoutError:
        pass
    finally:
        await runner.cleanup()
        await limiter.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--upstream", required=True, action="append", help="fake-gcs-server's http://host:port"
    )
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--write-rate", type=float, default=1000.0)
    parser.add_argument("--read-rate", type=float, default=5000.0)
    parser.add_argument("--object-rate", type=float, default=1.0)
    parser.add_argument("--burst", type=float, default=0.05, help="seconds of a bucket's rate")
    parser.add_argument(
        "--latency-ms", type=float, nargs=2, default=(0.0, 0.0), metavar=("LO", "HI"),
        help="each request's latency, uniform (half in, half back)",
    )  # fmt: skip
    parser.add_argument("--lifetime", type=float, default=1800.0)
    ns = parser.parse_args()
    lo, hi = ns.latency_ms
    limits = Limits(ns.write_rate, ns.read_rate, ns.object_rate, ns.burst, (lo / 1e3, hi / 1e3))
    asyncio.run(serve(ns.upstream, limits, ns.port, ns.lifetime))


if __name__ == "__main__":
    main()
