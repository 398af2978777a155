"""The pure content-hash rules (no filesystem)."""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

import pytest

from kinetic._core import content_hash as ch

# Values computed by keras-kinetic 0.0.4's Data.content_hash() (see
# tests/local/test_data_hashing.py for how): a file "a.txt" holding b"alpha\n", and an
# empty directory.
ORIGINAL_A_TXT = "d2db1d642e3362abfa6fdb15dcac440145c493cbcad472c49e9e662f0901e34a"
ORIGINAL_EMPTY_DIR = "9d1ae5a6cdbe837d499a16cb32234ea2d953c60e8e8fdc88f84a3bbe2d629143"


def test_file_digest_is_sha256_of_relpath_nul_bytes() -> None:
    expected = hashlib.sha256(b"dir/a.txt\0hello").digest()
    assert ch.file_digest("dir/a.txt", b"hello") == expected
    assert len(expected) == ch.DIGEST_SIZE


def test_file_hasher_streams_any_chunking() -> None:
    data = bytes(range(256)) * 5000
    for size in (1, 7, 4096, 1 << 20):
        h = ch.file_hasher("x")
        for off in range(0, len(data), size):
            h.update(memoryview(data)[off : off + size])
        assert h.digest() == ch.file_digest("x", data)


def test_single_file_hash_matches_the_original() -> None:
    digest = ch.file_digest("a.txt", b"alpha\n")
    assert ch.single_file_hash(digest) == ORIGINAL_A_TXT
    assert hashlib.sha256(b"file:" + digest).hexdigest() == ORIGINAL_A_TXT


def test_dir_hash_of_nothing_matches_the_original() -> None:
    assert ch.dir_hash([]) == ORIGINAL_EMPTY_DIR == hashlib.sha256(b"dir:").hexdigest()
    assert ch.dir_hasher().hexdigest() == ORIGINAL_EMPTY_DIR


def test_dir_hash_concatenates_raw_digests_in_order() -> None:
    d1, d2 = ch.file_digest("a", b"1"), ch.file_digest("b", b"2")
    assert ch.dir_hash([d1, d2]) == hashlib.sha256(b"dir:" + d1 + d2).hexdigest()
    assert ch.dir_hash([d1, d2]) != ch.dir_hash([d2, d1])
    h = ch.dir_hasher()
    h.update(d1)
    h.update(d2)
    assert h.hexdigest() == ch.dir_hash([d1, d2])


def test_file_and_directory_of_that_file_differ() -> None:
    digest = ch.file_digest("a.txt", b"alpha\n")
    assert ch.single_file_hash(digest) != ch.dir_hash([digest])


def test_name_content_boundary_and_entry_boundary() -> None:
    assert ch.file_digest("a", b"bc") != ch.file_digest("ab", b"c")
    one = ch.dir_hash([ch.file_digest("x", b"y"), ch.file_digest("z", b"")])
    two = ch.dir_hash([ch.file_digest("x", b""), ch.file_digest("yz", b"")])
    assert one != two


@pytest.mark.parametrize("bad", [b"", b"x" * 31, b"x" * 33, b"x" * 64])
def test_digests_of_the_wrong_size_are_refused(bad: bytes) -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        ch.single_file_hash(bad)
    with pytest.raises(ValueError, match="32 bytes"):
        ch.dir_hash([bad])


def test_walk_order_is_code_point_order() -> None:
    names = ["b", "a.txt", "B", "a-b", "a_b", "\u00fcber", "Z", "a"]
    assert ch.walk_order(names) == ["B", "Z", "a", "a-b", "a.txt", "a_b", "b", "\u00fcber"]


def test_join_relpath() -> None:
    assert ch.join_relpath("", "a.txt") == "a.txt"
    assert ch.join_relpath("sub", "a.txt") == f"sub{ch.SEP}a.txt"
    assert ch.join_relpath(ch.join_relpath("a", "b"), "c") == ch.SEP.join("abc")


def test_relpath_encoding() -> None:
    assert ch.encode_relpath("\u00fcber") == "\u00fcber".encode()
    # A name that is not UTF-8 on disk arrives surrogate-escaped: hash its raw bytes.
    raw = b"caf\xe9"
    assert ch.encode_relpath(raw.decode("utf-8", "surrogateescape")) == raw
    assert ch.file_digest(raw.decode("utf-8", "surrogateescape"), b"") == (
        hashlib.sha256(raw + b"\0").digest()
    )


def test_settled_needs_a_tick_after_the_last_change() -> None:
    t = 1_700_000_000_123_456_789
    window = ch.racy_window_ns(t, t)
    assert 0 < window <= 50_000_000
    assert not ch.is_settled(t, t, t)
    assert not ch.is_settled(t, t, t + window - 1)
    assert ch.is_settled(t, t, t + window)
    # ctime counts as much as mtime (a restored mtime is still a change).
    assert not ch.is_settled(t - 10**10, t, t + window - 1)
    # A timestamp in the future is never settled.
    assert not ch.is_settled(t + 10**12, t, t + window)


def test_whole_second_timestamps_get_a_wider_window() -> None:
    t = 1_700_000_000 * 10**9
    assert ch.racy_window_ns(t, t) >= 2 * 10**9
    assert not ch.is_settled(t, t, t + 10**9)
    assert ch.is_settled(t, t, t + ch.racy_window_ns(t, t))


def test_rules_module_is_sans_io() -> None:
    tree = ast.parse(Path(ch.__file__).read_text(encoding="utf-8"))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    # No asyncio/anyio/socket, no clock, no io; os only for os.sep.
    assert imported <= {"__future__", "collections", "hashlib", "os", "typing"}
    calls = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert "open" not in calls
    os_uses = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    }
    assert os_uses == {"sep"}
