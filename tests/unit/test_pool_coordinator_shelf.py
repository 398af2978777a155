"""The coordinator's shelf (runner/pool/coordinator/shelf.py): what it serves, read once."""

from __future__ import annotations

import asyncio

from runner import protocol
from runner.pool.coordinator.shelf import Shelf, servable_keys

GID = "g-shelf"
MANIFEST: protocol.BatchManifest = {  # type: ignore[typeddict-item]
    "total": 10,
    "chunk_size": 4,
    "spec": {"context_key": "contexts/abc.tar.gz"},
}


class Bucket:
    """Objects by key, each read counted; a read takes a moment (others ask meanwhile)."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects, self.reads = objects, 0

    async def read(self, key: str) -> bytes:
        self.reads += 1
        await asyncio.sleep(0.01)
        if key not in self.objects:
            raise FileNotFoundError(key)
        return self.objects[key]


def test_a_shelf_serves_exactly_its_batchs_objects_that_never_change() -> None:
    keys = servable_keys(GID, MANIFEST)
    assert keys == {
        protocol.group_manifest_key(GID),
        protocol.group_payload_key(GID),
        "contexts/abc.tar.gz",
        *(protocol.group_inputs_key(GID, c) for c in range(3)),
    }
    bucket = Bucket({"secrets/key": b"x", protocol.group_stop_key(GID): b"{}"})
    shelf = Shelf(keys, bucket.read)
    for other in ("secrets/key", protocol.group_stop_key(GID), "../etc/passwd"):
        assert asyncio.run(shelf.get(other)) is None
    assert bucket.reads == 0  # refused without a read


def test_many_asks_of_one_object_read_it_once() -> None:
    key = protocol.group_inputs_key(GID, 1)
    bucket = Bucket({key: b"chunk one"})
    shelf = Shelf(servable_keys(GID, MANIFEST), bucket.read)

    async def ask() -> list[bytes | None]:
        first = await asyncio.gather(*(shelf.get(key) for _ in range(50)))
        return [*first, await shelf.get(key)]

    assert asyncio.run(ask()) == [b"chunk one"] * 51
    assert bucket.reads == shelf.reads == 1


def test_a_missing_or_oversized_object_is_left_to_the_worker_and_not_read_by_each() -> None:
    small, large = protocol.group_inputs_key(GID, 0), protocol.group_payload_key(GID)
    bucket = Bucket({large: bytes(200)})
    shelf = Shelf(servable_keys(GID, MANIFEST), bucket.read, largest=100)

    async def ask(key: str) -> list[bytes | None]:
        return await asyncio.gather(*(shelf.get(key) for _ in range(5)))

    assert asyncio.run(ask(small)) == [None] * 5  # missing: the worker's own read says so
    assert asyncio.run(ask(large)) == [None] * 5
    assert bucket.reads == 2


def test_a_cancelled_reader_leaves_the_read_to_the_next_asker() -> None:
    key = protocol.group_inputs_key(GID, 2)
    bucket = Bucket({key: b"two"})
    shelf = Shelf(servable_keys(GID, MANIFEST), bucket.read)

    async def go() -> bytes | None:
        first = asyncio.ensure_future(shelf.get(key))
        second = asyncio.ensure_future(shelf.get(key))
        await asyncio.sleep(0)
        first.cancel()  # its worker's connection dropped mid-read
        return await second

    assert asyncio.run(go()) == b"two"
    assert bucket.reads == 2


def test_the_shelf_keeps_what_its_capacity_allows_least_recently_served_first() -> None:
    chunks = [protocol.group_inputs_key(GID, c) for c in range(3)]
    bucket = Bucket({k: bytes(40) for k in chunks})
    shelf = Shelf(servable_keys(GID, MANIFEST), bucket.read, capacity=100)

    async def go() -> None:
        await shelf.get(chunks[0])
        await shelf.get(chunks[1])
        await shelf.get(chunks[0])  # served again: kept longer than chunk 1
        await shelf.get(chunks[2])  # 120 bytes: chunk 1 goes
        await shelf.get(chunks[0])
        await shelf.get(chunks[1])

    asyncio.run(go())
    assert bucket.reads == 4  # chunk 1 read twice
