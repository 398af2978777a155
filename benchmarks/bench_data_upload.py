"""Upload of a 10,000-file tree to the content-addressed data cache on fake-gcs-server.

Run from the repository root: ``python benchmarks/bench_data_upload.py [--files N]``.
Prints files/s for several concurrency bounds (the library's default is
``kinetic._engine.data_refs.UPLOAD_CONCURRENCY``), the re-submission cost (marker
present: nothing uploaded), and writes ``benchmarks/results/data_upload.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import machine, write_results
from kinetic._data.hashing import hash_path
from kinetic._engine import data_refs
from kinetic._storage.gcs import GCSStorage
from tests.fix_gcs import _free_port, emulator_binary


def make_tree(root: Path, n: int) -> None:
    rng = random.Random(7)
    for i in range(n):
        d = root / f"d{i % 100:02d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i:05d}.bin").write_bytes(rng.randbytes(rng.randint(1024, 20 * 1024)))


def start_emulator() -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [str(emulator_binary()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
         "-port", str(port), "-external-url", url, "-log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/storage/v1/b?project=p", timeout=1).read()
            return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("fake-gcs-server did not start")


def create_bucket(url: str) -> str:
    name = f"bench-{uuid.uuid4().hex[:12]}"
    req = urllib.request.Request(
        url + "/storage/v1/b?project=p", data=f'{{"name": "{name}"}}'.encode(), method="POST"
    )
    req.add_header("Content-Type", "application/json")
    urllib.request.urlopen(req, timeout=10).read()
    return name


async def upload(bucket: str, tree: Path, digest: str) -> tuple[float, float]:
    store = GCSStorage(bucket)
    try:
        started = time.perf_counter()
        assert await data_refs.upload_to_cache(store, tree, digest)
        first = time.perf_counter() - started
        started = time.perf_counter()
        assert not await data_refs.upload_to_cache(store, tree, digest)  # marker present
        again = time.perf_counter() - started
    finally:
        await store.aclose()
    return first, again


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--bounds", default="4,16,64")
    ns = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kinetic-bench-upload-"))
    proc, url = start_emulator()
    os.environ["STORAGE_EMULATOR_HOST"] = url
    try:
        tree = workdir / "tree"
        make_tree(tree, ns.files)
        digest = hash_path(tree)
        rows = []
        for bound in (int(b) for b in ns.bounds.split(",")):
            data_refs.UPLOAD_CONCURRENCY = bound
            first, again = asyncio.run(upload(create_bucket(url), tree, digest))
            rows.append(
                {"concurrency": bound, "seconds": first, "files_per_s": ns.files / first,
                 "resubmit_seconds": again}
            )  # fmt: skip
            print(
                f"concurrency {bound:3d}: {ns.files / first:8.0f} files/s "
                f"({first:.2f} s); unchanged re-submission {again * 1e3:.1f} ms"
            )
        write_results(
            "data_upload",
            {"machine": machine(), "files": ns.files, "default_bound": 16, "runs": rows},
        )
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
