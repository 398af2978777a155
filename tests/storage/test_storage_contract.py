"""One contract suite for every Storage implementation.

Each test runs on LocalStorage (a temporary directory) and on GCSStorage against a
real fake-gcs-server (``tests.fix_gcs``). Tests specific to one implementation follow
at the end: LocalStorage's on-disk atomicity and permissions, GCSStorage's transport
failure translation, deadlines and lifecycle.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import stat
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import anyio
import pytest

from kinetic._exceptions import ConfigError, KineticError, ObjectNotFoundError, StorageError
from kinetic._storage.base import Storage
from kinetic._storage.gcs import GCSStorage
from kinetic._storage.local import LocalStorage
from tests.fix_gcs import RESET, FaultProxy, GCSEmulator

BIG_SIZE = 50 * 1024 * 1024 + 12_345  # >= 50 MB, not a multiple of any chunk size
MEMORY_BOUND = 24 * 1024 * 1024  # peak Python allocations during a big transfer

KINDS = ["local", pytest.param("gcs", marks=pytest.mark.storage)]


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    """The store under test (GCS ones are closed by the ``gcs_storage`` fixture)."""
    if kind == "local":
        return LocalStorage(tmp_path / "store")
    gcs: GCSStorage = request.getfixturevalue("gcs_storage")
    return gcs


@pytest.fixture
async def paged_store(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Storage]:
    """A store whose listings take several pages (GCS: 3 keys per page)."""
    s: Storage
    if kind == "local":
        s = LocalStorage(tmp_path / "store")
    else:
        s = GCSStorage(request.getfixturevalue("gcs_bucket"), page_size=3)
    try:
        yield s
    finally:
        await s.aclose()


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


async def collect(store: Storage, prefix: str = "") -> list[str]:
    return sorted([key async for key in store.list(prefix)])


# -- round trips ------------------------------------------------------------------


async def test_implements_protocol(store: Storage) -> None:
    assert isinstance(store, Storage)
    assert store.url.startswith(("file:///", "gs://"))


@pytest.mark.parametrize(
    ("key", "data"),
    [
        ("job-1a2b3c4d/result.pkl", b"hello"),
        ("empty", b""),
        ("deep/er/still/bytes.bin", bytes(range(256)) * 64),
        ("odd names/ü ñ+%#?.bin", b"quoted"),
    ],
)
async def test_write_read_round_trip(store: Storage, key: str, data: bytes) -> None:
    await store.write(key, data)
    assert await store.read(key) == data
    assert await store.size(key) == len(data)
    assert await store.exists(key)


async def test_overwrite_replaces(store: Storage) -> None:
    await store.write("k/v", b"first, and longer")
    await store.write("k/v", b"second")
    assert await store.read("k/v") == b"second"
    assert await store.size("k/v") == len(b"second")


async def test_write_many_writes_each_object(store: Storage) -> None:
    await store.write("job-9/spec.json", b"old")
    objects = {"job-9/payload.pkl": b"\x80payload", "job-9/spec.json": b"{}", "job-9/e": b""}
    await store.write_many(objects)
    assert {k: await store.read(k) for k in objects} == objects
    await store.write_many({})  # nothing to write is not an error


async def test_create_if_absent_has_one_winner(store: Storage) -> None:
    assert await store.create_if_absent("locks/one", b"first") is True
    assert await store.create_if_absent("locks/one", b"second") is False
    assert await store.read("locks/one") == b"first"
    # Concurrent creators of a fresh key: exactly one wins, and its bytes are the object.
    wins: list[bytes] = []

    async def race(n: int) -> None:
        data = f"creator {n}".encode()
        if await store.create_if_absent("locks/race", data):
            wins.append(data)

    async with anyio.create_task_group() as tg:
        for n in range(8):
            tg.start_soon(race, n)
    assert len(wins) == 1
    assert await store.read("locks/race") == wins[0]
    # No temporary object of a losing creator is left behind.
    assert {k async for k in store.list("locks/")} == {"locks/one", "locks/race"}


async def test_a_replace_at_a_generation_is_fenced_by_every_change(store: Storage) -> None:
    """What a pool's claims rely on: of a late renewal and a takeover, one wins."""
    made = await store.create_versioned("claims/0", b"lease to 10")
    assert made is not None
    assert await store.create_versioned("claims/0", b"another") is None
    assert await store.read_versioned("claims/0") == (b"lease to 10", made)
    renewed = await store.replace_if("claims/0", b"lease to 20", made)
    assert renewed is not None
    assert renewed != made
    # A replace at the generation read before that change fails, and changes nothing.
    assert await store.replace_if("claims/0", b"taken over", made) is None
    assert await store.read_versioned("claims/0") == (b"lease to 20", renewed)
    assert await store.replace_if("claims/missing", b"x", renewed) is None
    # Racing replacers at one generation: exactly one wins.
    wins: list[bytes] = []

    async def race(n: int) -> None:
        data = f"replacer {n}".encode()
        if await store.replace_if("claims/0", data, renewed) is not None:
            wins.append(data)

    async with anyio.create_task_group() as tg:
        for n in range(6):
            tg.start_soon(race, n)
    assert len(wins) == 1
    assert (await store.read_versioned("claims/0"))[0] == wins[0]
    assert {k async for k in store.list("claims/")} == {"claims/0"}  # nothing left aside
    with pytest.raises(ObjectNotFoundError):
        await store.read_versioned("claims/missing")


# -- missing objects ---------------------------------------------------------------


async def test_missing_object(store: Storage) -> None:
    for op in (store.read, store.size):
        with pytest.raises(ObjectNotFoundError) as info:
            await op("nope/missing.bin")
        assert info.value.key == "nope/missing.bin"
        assert isinstance(info.value, StorageError)
        assert isinstance(info.value, KineticError)
        assert isinstance(info.value, LookupError)
    assert not await store.exists("nope/missing.bin")
    assert await store.delete("nope/missing.bin") is False


async def test_download_missing_leaves_nothing(store: Storage, tmp_path: Path) -> None:
    dest_dir = tmp_path / "downloads"
    with pytest.raises(ObjectNotFoundError):
        await store.download_file("nope/missing.bin", dest_dir / "out.bin")
    assert not (dest_dir / "out.bin").exists()
    assert not dest_dir.exists() or list(dest_dir.iterdir()) == []


async def test_delete(store: Storage) -> None:
    await store.write("a/x", b"1")
    assert await store.delete("a/x") is True
    assert not await store.exists("a/x")
    assert await store.delete("a/x") is False


# -- listing -----------------------------------------------------------------------

LAYOUT = ["a/b", "a/c/d", "ab", "abc/x", "b/a", "z"]


async def test_list_with_prefix(store: Storage) -> None:
    for key in LAYOUT:
        await store.write(key, key.encode())
    assert await collect(store) == LAYOUT
    assert await collect(store, "a") == ["a/b", "a/c/d", "ab", "abc/x"]
    assert await collect(store, "a/") == ["a/b", "a/c/d"]
    assert await collect(store, "ab") == ["ab", "abc/x"]
    assert await collect(store, "a/c/") == ["a/c/d"]
    assert await collect(store, "nothing-here/") == []


async def test_list_empty_store(store: Storage) -> None:
    assert await collect(store) == []


async def test_list_follows_pages(
    paged_store: Storage, kind: str, request: pytest.FixtureRequest
) -> None:
    keys = sorted(f"p/{i:03d}" for i in range(11)) + ["q/1"]
    for key in keys:
        await paged_store.write(key, b"x")
    if kind == "gcs":
        # The emulator really pages (else this test would prove nothing).
        emulator: GCSEmulator = request.getfixturevalue("gcs_emulator")
        assert isinstance(paged_store, GCSStorage)
        page = emulator.request("GET", f"/storage/v1/b/{paged_store.bucket}/o?maxResults=3")
        assert len(page["items"]) == 3
        assert page["nextPageToken"]
    assert await collect(paged_store) == keys
    assert await collect(paged_store, "p/") == keys[:-1]


async def test_list_stops_early(paged_store: Storage) -> None:
    for i in range(7):
        await paged_store.write(f"e/{i}", b"x")
    seen = []
    async for key in paged_store.list("e/"):
        seen.append(key)
        if len(seen) == 4:
            break
    assert len(seen) == 4


async def test_delete_prefix(paged_store: Storage) -> None:
    many = [f"job-1/{i:03d}" for i in range(40)]
    for key in [*many, "job-1/sub/deep", "job-10/keep", "job-2/keep"]:
        await paged_store.write(key, b"x")
    assert await paged_store.delete_prefix("job-1/") == 41
    assert await collect(paged_store) == ["job-10/keep", "job-2/keep"]
    assert await paged_store.delete_prefix("job-1/") == 0
    assert await paged_store.delete_prefix("nothing/") == 0


# -- files ---------------------------------------------------------------------------


def _make_big_file(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    block = os.urandom(1024 * 1024)
    with path.open("wb") as f:
        written = 0
        n = 0
        while written < size:
            chunk = (n.to_bytes(8, "big") + block)[: size - written]
            f.write(chunk)
            digest.update(chunk)
            written += len(chunk)
            n += 1
    return digest.hexdigest()


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


@pytest.mark.timeout(120)
async def test_big_file_round_trip(store: Storage, tmp_path: Path) -> None:
    src = tmp_path / "big.src"
    want = await anyio.to_thread.run_sync(_make_big_file, src, BIG_SIZE)

    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        await store.upload_file("big/blob.bin", src)
        _, upload_peak = tracemalloc.get_traced_memory()
        assert await store.size("big/blob.bin") == BIG_SIZE

        dest = tmp_path / "out" / "nested" / "big.dst"
        tracemalloc.reset_peak()
        await store.download_file("big/blob.bin", dest)
        _, download_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert await anyio.to_thread.run_sync(_sha256_of, dest) == want
    print(f"peaks: upload {upload_peak / 2**20:.1f} MiB, download {download_peak / 2**20:.1f} MiB")
    assert upload_peak < MEMORY_BOUND, f"upload peaked at {upload_peak / 2**20:.1f} MiB"
    assert download_peak < MEMORY_BOUND, f"download peaked at {download_peak / 2**20:.1f} MiB"
    # The download went through a temporary file that is gone now.
    assert _names(dest.parent) == ["big.dst"]
    await store.delete("big/blob.bin")


async def test_small_file_round_trip_overwrites(store: Storage, tmp_path: Path) -> None:
    src = tmp_path / "small.src"
    src.write_bytes(b"payload")
    await store.upload_file("f/small", src)
    dest = tmp_path / "small.dst"
    dest.write_bytes(b"old content to be replaced")
    await store.download_file("f/small", dest)
    assert dest.read_bytes() == b"payload"


async def test_upload_missing_local_file(store: Storage, tmp_path: Path) -> None:
    with pytest.raises(StorageError):
        await store.upload_file("f/x", tmp_path / "does-not-exist")
    assert not await store.exists("f/x")


# -- keys ----------------------------------------------------------------------------

BAD_KEYS = ["../x", "/abs", "a/../b", "a//b", "./a", "", "a\\b", "nul\0byte"]


@pytest.mark.parametrize("key", BAD_KEYS)
async def test_invalid_keys_rejected(store: Storage, key: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"x")
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: store.read(key),
        lambda: store.write(key, b"x"),
        lambda: store.exists(key),
        lambda: store.size(key),
        lambda: store.delete(key),
        lambda: store.upload_file(key, src),
        lambda: store.download_file(key, tmp_path / "dst"),
    ]
    for call in calls:
        with pytest.raises(ConfigError):
            await call()
    assert not (tmp_path / "x").exists()
    assert not (tmp_path / "dst").exists()


# -- LocalStorage specifics -----------------------------------------------------------


def _all_paths(root: Path) -> list[Path]:
    return [root, *root.rglob("*")]


async def test_local_atomic_writes_and_private_dirs(tmp_path: Path) -> None:
    store = LocalStorage(tmp_path / "store")
    src = tmp_path / "src.bin"
    src.write_bytes(b"file" * 1000)
    await store.write("job-1/payload.pkl", b"x" * 10_000)
    await store.write("job-1/payload.pkl", b"y")
    await store.upload_file("job-2/deep/dir/file.bin", src)
    await store.download_file("job-2/deep/dir/file.bin", tmp_path / "dl" / "sub" / "f.bin")

    for root in (tmp_path / "store", tmp_path / "dl"):
        paths = _all_paths(root)
        assert not [p for p in paths if p.name.startswith(".tmp")], paths
        for p in paths:
            if p.is_dir():
                assert stat.S_IMODE(p.stat().st_mode) == 0o700, p
    assert (tmp_path / "store" / "job-1" / "payload.pkl").read_bytes() == b"y"


# -- GCSStorage specifics ---------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port  # nothing listens there once the socket is closed


@pytest.mark.storage
async def test_gcs_transport_failure_is_translated(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{_closed_port()}")
    timeout = 10.0
    caplog.set_level(logging.DEBUG, logger="kinetic._storage.gcs")
    async with GCSStorage("no-such-server", attempts=3, backoff=0.05) as store:
        started = time.monotonic()
        with pytest.raises(StorageError) as info:
            await store.read("k", timeout=timeout)
        elapsed = time.monotonic() - started
    assert not isinstance(info.value, ObjectNotFoundError)
    assert isinstance(info.value.__cause__, aiohttp.ClientConnectionError)
    assert elapsed < timeout
    retries = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) == 2  # attempts - 1


@pytest.mark.storage
async def test_gcs_every_operation_translates(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{_closed_port()}")
    src = tmp_path / "src"
    src.write_bytes(b"x")
    async with GCSStorage("no-such-server", attempts=2, backoff=0.01) as store:
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: store.read("k"),
            lambda: store.write("k", b"x"),
            lambda: store.create_if_absent("k", b"x"),
            lambda: store.exists("k"),
            lambda: store.size("k"),
            lambda: store.delete("k"),
            lambda: store.delete_prefix("k/"),
            lambda: store.upload_file("k", src),
            lambda: store.download_file("k", tmp_path / "dst"),
            lambda: collect(store, "k"),
        ]
        for call in calls:
            with pytest.raises(StorageError) as info:
                await call()
            assert type(info.value) is StorageError
    assert _names(tmp_path) == ["src"]


@pytest.mark.storage
async def test_gcs_stalled_server_hits_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)  # accepts connections (backlog) but never answers
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{server.getsockname()[1]}")
        async with GCSStorage("stalled") as store:
            started = time.monotonic()
            with pytest.raises(StorageError, match="timed out"):
                await store.read("k", timeout=1.0)
            elapsed = time.monotonic() - started
    assert 0.9 < elapsed < 5.0


@pytest.mark.storage
async def test_gcs_missing_bucket(gcs_emulator: GCSEmulator) -> None:
    async with GCSStorage("kt-bucket-that-does-not-exist") as store:
        with pytest.raises(StorageError) as info:
            await collect(store)
        assert not isinstance(info.value, ObjectNotFoundError)
        with pytest.raises(ObjectNotFoundError):
            await store.read("k")


@pytest.mark.storage
async def test_gcs_lifecycle(gcs_bucket: str) -> None:
    store = GCSStorage(gcs_bucket)
    assert store.url == f"gs://{gcs_bucket}"
    await store.aclose()  # never used: nothing to close
    with pytest.raises(StorageError, match="closed"):
        await store.read("k")

    store = GCSStorage(gcs_bucket)
    await store.write("k", b"v")
    await store.aclose()
    await store.aclose()  # idempotent
    with pytest.raises(StorageError, match="closed"):
        await store.write("k", b"v")


@pytest.mark.storage
async def test_gcs_borrowed_session_stays_open(gcs_bucket: str) -> None:
    async with aiohttp.ClientSession() as session:
        async with GCSStorage(gcs_bucket, session=session) as store:
            await store.write("k", b"v")
        assert not session.closed
        async with GCSStorage(gcs_bucket, session=session) as store:
            assert await store.read("k") == b"v"


@pytest.mark.parametrize(
    "kwargs", [{"page_size": 0}, {"attempts": 0}, {"max_concurrency": 0}, {"backoff": -1.0}]
)
def test_gcs_rejects_bad_options(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        GCSStorage("b", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("bucket", ["", "gs://b", "a/b"])
def test_gcs_rejects_bad_bucket(bucket: str) -> None:
    with pytest.raises(ConfigError):
        GCSStorage(bucket)


# -- cancellation ----------------------------------------------------------------------


@pytest.mark.parametrize("delay", [0.0, 0.01, 0.05])
async def test_cancelled_transfers_leave_nothing_partial(
    store: Storage, tmp_path: Path, delay: float
) -> None:
    size = 12 * 1024 * 1024
    src = tmp_path / "src.bin"
    want = await anyio.to_thread.run_sync(_make_big_file, src, size)
    await store.upload_file("c/full", src)

    with anyio.move_on_after(delay):
        await store.upload_file("c/partial", src)
    if await store.exists("c/partial"):  # finished before the cancel landed: all of it
        assert await store.size("c/partial") == size

    dest_dir = tmp_path / "dl"
    with anyio.move_on_after(delay):
        await store.download_file("c/full", dest_dir / "out.bin")
    names = await anyio.to_thread.run_sync(lambda: _names(dest_dir) if dest_dir.exists() else [])
    assert names in ([], ["out.bin"])
    if names:
        assert await anyio.to_thread.run_sync(_sha256_of, dest_dir / "out.bin") == want

    # The store is still usable afterwards.
    await store.write("c/after", b"ok")
    assert await store.read("c/after") == b"ok"


# -- retries through a fault-injecting proxy in front of the emulator --------------------


@pytest.mark.storage
@pytest.mark.parametrize("faults", [[503], [429, 500], [RESET], [502, RESET, 504]])
async def test_gcs_transient_faults_are_retried(
    gcs_fault_proxy: FaultProxy, gcs_bucket: str, faults: list[int]
) -> None:
    async with GCSStorage(gcs_bucket, attempts=4, backoff=0.01) as store:
        await store.write("k", b"v")
        gcs_fault_proxy.faults[:] = faults
        gcs_fault_proxy.seen.clear()
        assert await store.read("k") == b"v"
        assert len(gcs_fault_proxy.seen) == len(faults) + 1

        gcs_fault_proxy.faults[:] = faults
        await store.write("k", b"w")
        assert await store.read("k") == b"w"


@pytest.mark.storage
async def test_gcs_backs_off_at_least_slow_down_after_a_429(
    gcs_fault_proxy: FaultProxy, gcs_bucket: str
) -> None:
    # GCS takes about one write a second per object name: three 429s in a row must not
    # use up the attempts within that second (the back-off alone, U(0, 0.01 * 2**n),
    # would). Each retry after a 429 sleeps at least slow_down.
    async with GCSStorage(gcs_bucket, attempts=4, backoff=0.01, slow_down=0.2) as store:
        gcs_fault_proxy.faults[:] = [429, 429, 429]
        started = time.monotonic()
        await store.write("k", b"v")
        assert time.monotonic() - started >= 3 * 0.2
        assert len(gcs_fault_proxy.seen) == 4
        assert await store.read("k") == b"v"


@pytest.mark.storage
async def test_gcs_retries_a_429_sooner_where_no_name_can_have_been_written(
    gcs_fault_proxy: FaultProxy, gcs_bucket: str
) -> None:
    # A read, a listing, a create and a write of a name never written (a pool's burst)
    # cannot meet GCS's per-name limit: their 429 is the bucket's rate, whose excess
    # clears in a fraction of a second, so they are retried after the back-off alone.
    # A write of a name that may exist, and a replace, still wait slow_down more.
    async with GCSStorage(gcs_bucket, attempts=4, backoff=0.01, slow_down=30.0) as store:
        await store.write("k", b"v")
        gcs_fault_proxy.faults[:] = [429, 429]
        await store.write("fresh/burst", b"b", fresh=True)
        gcs_fault_proxy.faults[:] = [429, 429]
        assert await store.create_versioned("fresh/claim", b"c") is not None
        gcs_fault_proxy.faults[:] = [429, 429]
        assert await store.read("fresh/burst") == b"b"
        gcs_fault_proxy.faults[:] = [429]
        assert [k async for k in store.list("fresh/")] == ["fresh/burst", "fresh/claim"]
        gcs_fault_proxy.faults[:] = [429]
        with pytest.raises(StorageError, match="timed out"):
            await store.write("k", b"w", timeout=2.0)  # waits slow_down (30 s) first
    # (Each 429 above would otherwise have cost 30 s: the test's own timeout.)


@pytest.mark.storage
@pytest.mark.parametrize("status", [400, 401, 403, 412])
async def test_gcs_permanent_faults_are_not_retried(
    gcs_fault_proxy: FaultProxy, gcs_bucket: str, status: int
) -> None:
    async with GCSStorage(gcs_bucket, attempts=4, backoff=0.01) as store:
        gcs_fault_proxy.faults[:] = [status]
        with pytest.raises(StorageError, match=f"HTTP {status}") as info:
            await store.read("k")
        assert type(info.value) is StorageError
        assert isinstance(info.value.__cause__, aiohttp.ClientResponseError)
        assert len(gcs_fault_proxy.seen) == 1


@pytest.mark.storage
async def test_gcs_gives_up_after_its_attempts(
    gcs_fault_proxy: FaultProxy, gcs_bucket: str
) -> None:
    async with GCSStorage(gcs_bucket, attempts=3, backoff=0.01) as store:
        gcs_fault_proxy.faults[:] = [503] * 5
        with pytest.raises(StorageError, match="HTTP 503"):
            await store.exists("k")
        assert len(gcs_fault_proxy.seen) == 3


@pytest.mark.storage
async def test_gcs_list_retries_each_page(gcs_fault_proxy: FaultProxy, gcs_bucket: str) -> None:
    async with GCSStorage(gcs_bucket, page_size=2, backoff=0.01) as store:
        keys = [f"l/{i}" for i in range(5)]
        for key in keys:
            await store.write(key, b"x")
        gcs_fault_proxy.seen.clear()
        seen: list[str] = []
        async for key in store.list("l/"):
            seen.append(key)
            if len(seen) == 2:
                gcs_fault_proxy.faults[:] = [503]  # hits the second page's request
        assert seen == keys
        assert len(gcs_fault_proxy.seen) == 4  # 3 pages + 1 retry


@pytest.mark.storage
async def test_gcs_write_to_missing_bucket(gcs_emulator: GCSEmulator, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"x")
    async with GCSStorage("kt-bucket-that-does-not-exist") as store:
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: store.write("k", b"x"),
            lambda: store.write_many({"k": b"x", "l": b"y"}),  # one error, not a group
            lambda: store.upload_file("k", src),
        ]
        for call in calls:
            with pytest.raises(StorageError, match="HTTP 404") as info:
                await call()
            assert not isinstance(info.value, ObjectNotFoundError)
