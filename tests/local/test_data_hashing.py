"""Content hashing of real trees: digests pinned to the original, stat cache, races, errors."""

from __future__ import annotations

import hashlib
import inspect
import json
import marshal
import os
import pickle
import random
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import anyio
import cloudpickle
import pytest

from kinetic._core import content_hash as ch
from kinetic._data import hashing
from kinetic._data.data import Data, GcsSource, HfSource
from kinetic._data.hashing import ahash_path, hash_path, hash_tree
from kinetic._exceptions import ConfigError, DataError

REPO = Path(__file__).resolve().parents[2]


def _make_tree(root: Path) -> None:
    """Build the pinned tree. Stdlib only: it also runs under keras-kinetic 0.0.4."""
    root.mkdir()
    (root / "a.txt").write_bytes(b"alpha\n")
    (root / "B.txt").write_bytes(b"upper case sorts before lower case\n")
    (root / "a-b.txt").write_bytes(b"dash sorts before dot\n")
    (root / "empty.bin").write_bytes(b"")
    # Longer than the original's 256 KiB read, so chunking is exercised on both sides.
    (root / "big.bin").write_bytes(bytes(i * 7 % 251 for i in range(300_000)))
    (root / "\u00fcber.txt").write_bytes(b"a non-ASCII name\n")
    (root / "zz_last.txt").write_bytes(b"a root file sorting after the directories\n")
    (root / "link_to_a").symlink_to("a.txt")  # a symlinked file: hashed with a's bytes
    (root / "sub").mkdir()
    (root / "sub" / "c.txt").write_bytes(b"charlie" * 100)
    (root / "sub" / "deeper").mkdir()
    (root / "sub" / "deeper" / "d.txt").write_bytes(b"delta")
    (root / "sub" / "z.txt").write_bytes(b"after deeper/ in name order, before it in walk order")
    (root / "link_to_sub").symlink_to("sub", target_is_directory=True)  # not descended
    (root / "empty_dir").mkdir()
    (root / "many").mkdir()  # more than 16 files: the original's thread-pool path
    for i in range(40):
        (root / "many" / f"f{i:03d}.txt").write_bytes(f"file number {i}\n".encode())


# Computed by keras-kinetic 0.0.4 (pip install keras-kinetic==0.0.4 in its own venv):
# `Data(str(tree / target)).content_hash()` on the tree built by `_make_tree`, run as
# test_pinned_digests_are_the_originals does below (set KERAS_KINETIC_PYTHON to
# that venv's python to recompute them).
PINNED = {
    ".": "eb8c17deffad6cd68104b0b7a6f48a0ba4a9060d9623cf32aeb54a41e4d99686",
    "sub": "1cdbd8898ff69d2b0a8b0ec5064eb12b8faf1696f51ef64a03b99eaa6df8a8fe",
    "sub/deeper": "c4cc6023dd4bb48d4fbac0bff2ecc9ed9fa8096136883a7e2254960f80cc92a2",
    "empty_dir": "9d1ae5a6cdbe837d499a16cb32234ea2d953c60e8e8fdc88f84a3bbe2d629143",
    "many": "dd39eb45d7fcec33a3c697ebb42a379e80983a093f45efc3bea1f9ec95f1d451",
    "a.txt": "d2db1d642e3362abfa6fdb15dcac440145c493cbcad472c49e9e662f0901e34a",
    "big.bin": "9c9e8aa8bcd535d7d23cf5f29665333275e8dfc813f2a9223faf21032d94ef94",
    "empty.bin": "118dace6905a06fae684bf65284efcb9ce2f46a0c26f5c6d09ed9e7f6b2caf8a",
    "link_to_a": "296a610b6dbb63ef8636c38fcb1b85befdd4662e26b2bc9dac2524a579c0b91c",
    "link_to_sub": "1cdbd8898ff69d2b0a8b0ec5064eb12b8faf1696f51ef64a03b99eaa6df8a8fe",
}

_ORIGINAL_SCRIPT = """
import json, sys, tempfile
from pathlib import Path
from kinetic.data import Data
{make_tree}
with tempfile.TemporaryDirectory() as tmp:
    tree = Path(tmp) / "tree"
    _make_tree(tree)
    print(json.dumps({{t: Data(str(tree / t)).content_hash() for t in sys.argv[1:]}}))
"""


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private stat cache for each test (also seen by the subprocesses it starts)."""
    path = tmp_path / "kinetic-cache"
    monkeypatch.setenv("KINETIC_CACHE_DIR", str(path))
    return path


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    _make_tree(root)
    return root


def _hash_in_new_process(path: Path) -> dict[str, object]:
    """Hash in a fresh interpreter (nothing in memory); return its digest and stats."""
    code = textwrap.dedent(
        """
        import json, sys
        from kinetic._data.hashing import hash_tree
        r = hash_tree(sys.argv[1])
        s = r.stats
        print(json.dumps({"digest": r.digest, "files": s.files, "hits": s.cache_hits,
                          "read": s.files_read, "bytes": s.bytes_read, "saved": s.cache_saved}))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


# -- equal to the original ----------------------------------------------------------------


@pytest.mark.parametrize("target", sorted(PINNED))
def test_digest_equals_the_originals(tree: Path, target: str) -> None:
    assert hash_path(tree / target) == PINNED[target]
    assert Data(str(tree / target)).content_hash() == PINNED[target]


async def test_async_digest_equals_the_originals(tree: Path) -> None:
    assert await ahash_path(tree) == PINNED["."]
    assert await Data(tree / "a.txt").acontent_hash() == PINNED["a.txt"]


def test_pinned_digests_follow_the_documented_rules(tree: Path) -> None:
    def digest(rel: str) -> bytes:
        return ch.file_digest(rel, (tree / rel).read_bytes())

    assert PINNED["empty_dir"] == hashlib.sha256(b"dir:").hexdigest()
    assert PINNED["a.txt"] == ch.single_file_hash(digest("a.txt"))
    link = ch.file_digest("link_to_a", (tree / "a.txt").read_bytes())  # the link's own name
    assert PINNED["link_to_a"] == ch.single_file_hash(link)
    # Root files first (sorted), then each directory depth first; link_to_sub skipped.
    order = ["B.txt", "a-b.txt", "a.txt", "big.bin", "empty.bin", "link_to_a", "zz_last.txt"]
    order += ["\u00fcber.txt"]
    order += [f"many/f{i:03d}.txt" for i in range(40)]
    order += ["sub/c.txt", "sub/z.txt", "sub/deeper/d.txt"]
    assert PINNED["."] == ch.dir_hash(digest(rel) for rel in order)
    sub = ["c.txt", "z.txt", "deeper/d.txt"]
    assert PINNED["sub"] == ch.dir_hash(
        ch.file_digest(rel, (tree / "sub" / rel).read_bytes()) for rel in sub
    )


@pytest.mark.skipif(
    not os.environ.get("KERAS_KINETIC_PYTHON"),
    reason="set KERAS_KINETIC_PYTHON to a python with keras-kinetic==0.0.4 to recompute",
)
def test_pinned_digests_are_the_originals() -> None:
    script = _ORIGINAL_SCRIPT.format(make_tree=inspect.getsource(_make_tree))
    out = subprocess.run(
        [os.environ["KERAS_KINETIC_PYTHON"], "-I", "-c", script, *sorted(PINNED)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert json.loads(out.stdout) == PINNED


def _reference_digest(root: Path) -> str:
    """The rules applied the plain way: os.walk, sorted, one file at a time."""
    digests = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            data = Path(path).read_bytes()
            digests.append(ch.file_digest(os.path.relpath(path, root), data))
    return ch.dir_hash(digests)


def _make_mixed_tree(root: Path, seed: int) -> None:
    rng = random.Random(seed)
    sizes = [0, 100, 20_000, 70_000, 600_000, 5 << 20]
    for d in ["", "a", "a/x", "b", "c"]:
        (root / d).mkdir(parents=True, exist_ok=True)
        for i in range(25):
            (root / d / f"f{i:02d}").write_bytes(rng.randbytes(rng.choice(sizes)))


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_mixed_tree_matches_the_rules_through_every_path(tmp_path: Path, workers: int) -> None:
    # Small files read inline, big ones on the pool, hits in between: order must hold.
    root = tmp_path / "mixed"
    _make_mixed_tree(root, seed=workers)
    expected = _reference_digest(root)
    assert hash_tree(root, use_cache=False, max_workers=workers).digest == expected
    assert hash_tree(root, max_workers=workers).digest == expected
    # Change some files (every kind of size), drop one, add one: a partly warm cache.
    rng = random.Random(99)
    changed = [p for p in sorted(root.rglob("f*"))[::9] if p != root / "b" / "f03"]
    for path in changed:
        path.write_bytes(rng.randbytes(path.stat().st_size + 1))
    (root / "b" / "f03").unlink()
    (root / "a" / "x" / "new").write_bytes(b"new")
    result = hash_tree(root, max_workers=workers)
    assert result.digest == _reference_digest(root)
    assert result.stats.files_read == len(changed) + 1
    again = hash_tree(root, max_workers=workers)
    assert (again.digest, again.stats.files_read) == (result.digest, 0)


# -- stat cache ---------------------------------------------------------------------------


def test_unchanged_tree_is_hashed_from_the_stat_cache_in_a_new_process(
    tree: Path, cache_dir: Path
) -> None:
    first = _hash_in_new_process(tree)
    assert first["digest"] == PINNED["."]
    assert first["read"] == first["files"] == 51
    assert first["hits"] == 0
    assert first["saved"] is True
    assert len(list(cache_dir.rglob("*.bin"))) == 1

    second = _hash_in_new_process(tree)
    assert second["digest"] == PINNED["."]
    assert second["hits"] == 51
    assert second["read"] == second["bytes"] == 0  # not one file was opened
    assert second["saved"] is False


def test_same_size_rewrite_with_a_new_mtime_is_read_again(tree: Path) -> None:
    assert _hash_in_new_process(tree)["digest"] == PINNED["."]
    target = tree / "sub" / "c.txt"
    before = target.stat()
    target.write_bytes(b"CHARLIE" * 100)  # same size
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))

    after = _hash_in_new_process(tree)
    assert after["read"] == 1
    assert after["hits"] == 50
    assert after["digest"] != PINNED["."]
    assert after["digest"] == hash_tree(tree, use_cache=False).digest


def test_same_size_rewrite_with_the_old_mtime_restored_is_read_again(tree: Path) -> None:
    # `touch -r` / `rsync -t` put the old mtime back; ctime still tells.
    assert _hash_in_new_process(tree)["digest"] == PINNED["."]
    target = tree / "a.txt"
    before = target.stat()
    time.sleep(0.05)  # let ctime move on
    target.write_bytes(b"ALPHA\n")
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert target.stat().st_mtime_ns == before.st_mtime_ns

    after = _hash_in_new_process(tree)
    assert after["read"] == 2  # a.txt and link_to_a, the same inode
    assert after["digest"] == hash_tree(tree, use_cache=False).digest != PINNED["."]


def test_added_and_removed_files_change_the_digest(tree: Path) -> None:
    assert hash_tree(tree).digest == PINNED["."]
    (tree / "many" / "f000.txt").unlink()
    (tree / "sub" / "new.txt").write_bytes(b"new")
    result = hash_tree(tree)
    assert result.stats.files_read == 1
    assert result.digest == hash_tree(tree, use_cache=False).digest != PINNED["."]
    assert hash_tree(tree).stats.files_read == 0


def test_single_file_uses_the_stat_cache(tree: Path) -> None:
    first = hash_tree(tree / "big.bin")
    second = hash_tree(tree / "big.bin")
    assert first.digest == second.digest == PINNED["big.bin"]
    assert (first.stats.files_read, second.stats.files_read) == (1, 0)
    assert second.stats.cache_hits == 1


def test_corrupt_cache_file_is_ignored_and_rewritten(tree: Path, cache_dir: Path) -> None:
    hash_tree(tree)
    [cache_file] = cache_dir.rglob("*.bin")
    cache_file.write_bytes(cache_file.read_bytes()[:-10])  # torn
    result = hash_tree(tree)
    assert result.digest == PINNED["."]
    assert result.stats.cache_hits == 0
    assert result.stats.cache_saved is True
    assert hash_tree(tree).stats.cache_hits == 51


def test_cache_file_of_another_layout_is_ignored(tree: Path, cache_dir: Path) -> None:
    first = hash_tree(tree)
    assert first.stats.cache_file is not None
    payload = marshal.dumps(("dir", str(tree), os.sep, {"": ("not", "a", "record")}))
    blob = hashing._CACHE_MAGIC + hashlib.sha256(payload).digest() + payload
    first.stats.cache_file.write_bytes(blob)
    result = hash_tree(tree)
    assert (result.digest, result.stats.cache_hits) == (PINNED["."], 0)


def test_unwritable_cache_dir_does_not_fail_the_hash(
    tree: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_bytes(b"")
    result = hash_tree(tree, cache_dir=blocker / "cache")
    assert result.digest == PINNED["."]
    assert result.stats.cache_saved is False
    assert "cannot write hash stat cache" in caplog.text


def test_concurrent_processes_share_the_cache_safely(tree: Path, cache_dir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    code = "import sys; from kinetic._data.hashing import hash_path; print(hash_path(sys.argv[1]))"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tree)], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs == [PINNED["."]] * 4
    assert [p.name for p in cache_dir.rglob("*") if p.name.endswith(".tmp")] == []
    assert _hash_in_new_process(tree)["read"] == 0


# -- files changing while they are hashed -------------------------------------------------


_CHUNK = 16 << 10
_CHUNKS = 16
_GENERATIONS = (b"a", b"b", b"c")  # a -> b -> c -> a: a torn read cannot pass for a state


def _generation(i: int) -> bytes:
    return _GENERATIONS[i % 3] * (_CHUNK * _CHUNKS)


def _states_on_disk() -> set[str]:
    """Digests of every state the writer leaves on disk: while it rewrites generation i
    over i - 1 chunk by chunk, the first k chunks are new and the rest old."""
    digests = set()
    for i in range(3):
        new, old = _generation(i + 1), _generation(i)
        for k in range(_CHUNKS + 1):
            state = new[: k * _CHUNK] + old[k * _CHUNK :]
            digests.add(ch.dir_hash([ch.file_digest("data.bin", state)]))
    return digests


_WRITER = """
import os, sys, time
path, staging, atomic = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
chunk, chunks = int(sys.argv[4]), int(sys.argv[5])
gens = (b"a", b"b", b"c")
fd = os.open(path, os.O_WRONLY)
i = 0
while True:
    busy_until = time.monotonic() + 0.2  # rewrite nonstop for a while, then rest
    while time.monotonic() < busy_until:
        i += 1
        data = gens[i % 3] * (chunk * chunks)
        if atomic:  # a new file, written outside the tree, renamed over the old one
            with open(staging, "wb") as f:
                f.write(data)
            os.replace(staging, path)
        else:  # rewritten in place chunk by chunk (torn states exist on disk)
            for off in range(0, len(data), chunk):
                os.pwrite(fd, data[off : off + chunk], off)
    time.sleep(0.1)
"""


@pytest.mark.parametrize("atomic", [False, True], ids=["in-place", "rename"])
def test_file_rewritten_during_hashing_gives_one_state_or_data_error(
    tmp_path: Path, atomic: bool
) -> None:
    root = tmp_path / "racy"
    root.mkdir()
    (root / "data.bin").write_bytes(_generation(0))
    valid = _states_on_disk()
    # A separate process, so that the writer truly runs while we read (no shared GIL).
    argv = [str(root / "data.bin"), str(tmp_path / "staging"), str(int(atomic))]
    argv += [str(_CHUNK), str(_CHUNKS)]
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, *argv])
    outcomes: list[str] = []
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                # Without the cache every call reads; with it, stale hits would show.
                digest = hash_tree(root, use_cache=len(outcomes) % 2 == 0).digest
            except DataError as exc:
                outcomes.append(str(exc))
            else:
                # A read torn by a concurrent write would show old chunks before new ones.
                outcomes.append("ok" if digest in valid else "TORN")
    finally:
        writer.kill()
        writer.wait()
    assert "ok" in outcomes
    odd = {o for o in outcomes if o != "ok" and "changed while being hashed" not in o}
    assert not odd
    # Whatever was cached during the storm, the settled file hashes to its real content.
    final = ch.dir_hash([ch.file_digest("data.bin", (root / "data.bin").read_bytes())])
    assert hash_tree(root).digest == final
    assert _hash_in_new_process(root)["digest"] == final


def _rewrite_during_reads(monkeypatch: pytest.MonkeyPatch, path: Path, times: int) -> list[bytes]:
    """Make the first ``times`` reads of ``path`` rewrite it (same size) after one chunk."""
    real_readv = os.readv
    written: list[bytes] = []

    def readv(fd: int, buffers: list[memoryview]) -> int:
        n = real_readv(fd, buffers)
        first_chunk = os.lseek(fd, 0, os.SEEK_CUR) == n
        if first_chunk and len(written) < times and os.path.samestat(os.fstat(fd), path.stat()):
            data = bytes([len(written) + 1]) * path.stat().st_size
            with open(path, "r+b") as f:
                f.write(data)
            written.append(data)
        return n

    monkeypatch.setattr(os, "readv", readv)
    return written


def test_change_during_a_read_is_detected_and_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "r"
    root.mkdir()
    (root / "f.bin").write_bytes(b"\0" * (3 << 20))  # three 1 MiB chunks
    written = _rewrite_during_reads(monkeypatch, root / "f.bin", times=1)
    result = hash_tree(root)
    assert len(written) == 1
    assert result.stats.files_read == 1
    assert result.stats.bytes_read == 2 * (3 << 20)  # the torn read, then a clean one
    assert result.digest == ch.dir_hash([ch.file_digest("f.bin", written[0])])


def test_change_during_every_read_is_a_data_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "r"
    root.mkdir()
    (root / "f.bin").write_bytes(b"\0" * (3 << 20))
    _rewrite_during_reads(monkeypatch, root / "f.bin", times=2)
    with pytest.raises(DataError, match=r"changed while being hashed \(2 attempts\)"):
        hash_tree(root)


def test_file_appended_continuously_raises_data_error(tmp_path: Path) -> None:
    root = tmp_path / "log"
    root.mkdir()
    log = open(root / "app.log", "ab", buffering=0)  # noqa: SIM115 - closed below
    stop = threading.Event()

    def append() -> None:
        while not stop.is_set():
            log.write(b"x" * 4096)

    writer = threading.Thread(target=append)
    writer.start()
    try:
        with pytest.raises(DataError, match="changed while being hashed"):
            hash_tree(root)
    finally:
        stop.set()
        writer.join()
        log.close()


# -- walk rules and bad trees -------------------------------------------------------------


def test_dangling_symlink_is_a_data_error(tree: Path) -> None:
    (tree / "sub" / "dangling").symlink_to("nowhere")
    with pytest.raises(DataError, match="dangling symlink"):
        hash_path(tree)


def test_special_file_is_a_data_error(tree: Path) -> None:
    os.mkfifo(tree / "sub" / "fifo")  # the original would block on it forever
    with pytest.raises(DataError, match="not a regular file"):
        hash_path(tree)


def test_symlink_loop_in_a_directory_is_skipped_like_the_original(tree: Path) -> None:
    (tree / "sub" / "loop").symlink_to("..", target_is_directory=True)
    assert hash_path(tree) == PINNED["."]


def test_missing_path_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        hash_path(tmp_path / "missing")


def test_path_removed_after_data_was_made(tree: Path) -> None:
    data = Data(str(tree / "a.txt"))
    (tree / "a.txt").unlink()
    with pytest.raises(DataError, match="does not exist"):
        data.content_hash()


async def test_ahash_path_can_be_cancelled(tmp_path: Path, cache_dir: Path) -> None:
    root = tmp_path / "wide"
    root.mkdir()
    chunk = os.urandom(1 << 20)
    for i in range(200):  # 200 MiB: far longer to hash than the deadline below
        (root / f"{i:04d}.bin").write_bytes(chunk)
    with anyio.move_on_after(0.05) as scope:
        await ahash_path(root)
    assert scope.cancelled_caught
    # Cancelled work left neither threads nor a cache file behind.
    assert not [t for t in threading.enumerate() if t.name.startswith("kinetic-hash")]
    assert not _cache_files(cache_dir)
    assert await ahash_path(root) == hash_tree(root, use_cache=False).digest


def _cache_files(cache_dir: Path) -> list[Path]:
    return list(cache_dir.rglob("*.bin"))


# -- Data -----------------------------------------------------------------------------------


def test_local_data(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tree)
    d = Data("sub")
    assert d.path == str(tree / "sub")
    assert (d.is_dir, d.is_gcs, d.is_hf, d.fuse, d.hf_trust_remote_code) == (
        True,
        False,
        False,
        False,
        False,
    )
    assert d.gcs is None
    assert d.hf is None
    assert not Data(tree / "a.txt").is_dir
    assert Data("~").path == os.path.expanduser("~")
    assert Data(str(tree / "a.txt"), fuse=True).fuse


@pytest.mark.parametrize(
    ("path", "match"),
    [
        ("", "must not be empty"),
        ("/definitely/not/here", "does not exist"),
        ("hf://", "invalid Hugging Face dataset id"),
        ("hf://a/b/c", "invalid Hugging Face dataset id"),
        ("hf://imdb?split=train&split=test", "given twice"),
        ("hf://imdb?splits=train", "unknown parameter 'splits'"),
        ("hf://imdb?split=", "is empty"),
        ("hf://imdb?split", "malformed query"),
        ("hf://imdb#x", "no #fragment"),
        ("gs://", "invalid GCS bucket"),
        ("gs://Upper/x", "invalid GCS bucket"),
        ("gs://bucket/x\ny", "line breaks"),
    ],
)
def test_bad_data_is_a_data_error(path: str, match: str) -> None:
    with pytest.raises(DataError, match=match) as info:
        Data(path)
    assert isinstance(info.value, ConfigError)
    assert isinstance(info.value, ValueError)


def test_bad_argument_types() -> None:
    with pytest.raises(DataError, match="str or a path"):
        Data(42)  # type: ignore[arg-type]
    with pytest.raises(DataError, match="fuse must be True or False"):
        Data("gs://bucket/x/", fuse="yes")  # type: ignore[arg-type]


def test_hf_with_fuse_is_refused() -> None:
    with pytest.raises(DataError, match="fuse=True is not supported for Hugging Face"):
        Data("hf://imdb", fuse=True)


def test_gcs_data() -> None:
    d = Data("gs://my-bucket/data/")
    assert (d.path, d.is_gcs, d.is_hf, d.is_dir) == ("gs://my-bucket/data/", True, False, True)
    assert d.gcs == GcsSource("my-bucket", "data", is_dir=True)
    assert Data("gs://my-bucket/data/file.csv").gcs == GcsSource(
        "my-bucket", "data/file.csv", is_dir=False
    )
    whole = Data("gs://my-bucket")
    assert (whole.path, whole.is_dir, whole.gcs) == (
        "gs://my-bucket/",
        True,
        GcsSource("my-bucket", "", is_dir=True),
    )
    assert Data("gs://my-bucket/x/", fuse=True).fuse


def test_gcs_path_without_slash_or_extension_warns(caplog: pytest.LogCaptureFixture) -> None:
    assert not Data("gs://my-bucket/dataset").is_dir
    assert "add a trailing slash" in caplog.text


def test_hf_data() -> None:
    d = Data("hf://org/repo?split=train[:10%25]&config_name=en&revision=v1.0")
    assert (d.is_hf, d.is_gcs, d.is_dir) == (True, False, True)
    assert d.path == "hf://org/repo?split=train[:10%25]&config_name=en&revision=v1.0"
    assert d.hf == HfSource("org/repo", split="train[:10%]", config_name="en", revision="v1.0")
    assert Data("hf://imdb").hf == HfSource("imdb")
    assert Data("hf://imdb", hf_trust_remote_code=True).hf_trust_remote_code


@pytest.mark.parametrize("uri", ["gs://bucket/data/", "hf://imdb?split=train"])
def test_content_hash_of_cloud_data_is_a_data_error(uri: str) -> None:
    with pytest.raises(DataError, match="Cannot compute content hash for cloud URI"):
        Data(uri).content_hash()


async def test_acontent_hash_of_cloud_data_is_a_data_error() -> None:
    with pytest.raises(DataError, match="cloud URI"):
        await Data("gs://bucket/data/").acontent_hash()


def test_repr_equality_and_hash(tree: Path) -> None:
    assert repr(Data("gs://bucket/path/")) == "Data('gs://bucket/path/')"
    assert repr(Data("gs://bucket/path/", fuse=True)) == "Data('gs://bucket/path/', fuse=True)"
    assert (
        repr(Data("hf://imdb", hf_trust_remote_code=True))
        == "Data('hf://imdb', hf_trust_remote_code=True)"
    )
    assert repr(Data(tree)) == f"Data({str(tree)!r})"
    assert Data(str(tree)) == Data(tree) == Data(str(tree) + "/")
    assert len({Data(str(tree)), Data(tree), Data(tree, fuse=True)}) == 2
    assert Data(tree) != Data(tree, fuse=True)
    assert Data(tree) != str(tree)


def test_data_is_immutable(tree: Path) -> None:
    d = Data(tree)
    with pytest.raises(AttributeError, match="immutable"):
        d._path = "/elsewhere"
    with pytest.raises(AttributeError, match="immutable"):
        del d._fuse
    assert d == Data(tree)


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps])
def test_data_pickles_without_touching_the_filesystem(
    tree: Path, dumps: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert callable(dumps)
    items = [
        Data(tree, fuse=True),
        Data("gs://bucket/data/"),
        Data("hf://org/repo?split=train", hf_trust_remote_code=True),
    ]
    blobs = [dumps(d) for d in items]
    monkeypatch.setattr(os.path, "exists", lambda _: False)  # the remote side has no tree
    restored = [pickle.loads(b) for b in blobs]
    assert restored == items
    assert [r.hf for r in restored] == [d.hf for d in items]
    assert restored[1].gcs == GcsSource("bucket", "data", is_dir=True)
