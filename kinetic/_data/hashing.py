"""Content hashing of local ``Data`` paths: the IO side of :mod:`kinetic._core.content_hash`.

Theory of operation
-------------------
One call hashes one root (a directory or a single file) in five steps:

1. **Walk.** The calling thread walks the tree in the canonical order (a directory's
   files sorted by name, then its subdirectories sorted by name, depth first), listing
   each directory once through a directory fd and ``stat``-ing each entry relative to it
   (following symlinks). Symlinked directories are skipped, dangling symlinks and special
   files raise :class:`~kinetic.DataError`. Only one directory listing is held at a time.
2. **Stat cache.** Each file's ``(size, mtime_ns, ctime_ns, inode, device)`` is compared
   with the one cached with its digest under this root. A match reuses the digest without
   opening the file, so an unchanged tree costs one ``stat`` per file; a directory whose
   file names and stats all match is settled with two list comparisons and one hash
   update, without per-file Python work.
3. **Read.** Misses are grouped into jobs of consecutive files (by count and by bytes,
   so a big file is a job of its own). Jobs of big files go to a thread pool owned by the
   call, started once there is enough to hash to pay for it: :mod:`hashlib` and
   ``os.readv`` release the GIL, so they hash on all cores. Jobs of small files are read
   by the calling thread meanwhile: for them the GIL-held work per file outweighs the
   hashing, and more threads only contend. Each file is read in
   1 MiB chunks through one fd; its stat before the read (the walk's) and its ``fstat``
   after must agree, or the file is read once more and then
   :class:`~kinetic.DataError` is raised. Files changed less than one timestamp tick
   before that first stat are waited on first (see
   :func:`~kinetic._core.content_hash.is_settled`), so a change during the read cannot
   hide behind an unchanged mtime or ctime, nor can a cached digest go stale that way.
4. **Combine.** Digests are fed to the directory hash in walk order. At most
   ``4 * workers`` jobs are in flight, which bounds memory on trees of any size.
5. **Save.** If anything changed, the cache file of this root is rewritten atomically.

Stat cache
----------
One file per hashed root under ``${KINETIC_CACHE_DIR:-~/.kinetic/cache}/hash-stat-cache-v1/``,
named by the SHA-256 of the root's kind and absolute path, in the checksummed format of
:mod:`kinetic._data.stat_cache`. Its :mod:`marshal` payload is
``(kind, root, os.sep, {dir relpath: (file names, stat keys, digests)})``:
per directory, its regular files' names in walk order, their stat keys ``(size, mtime_ns,
ctime_ns, inode, device)`` packed as ``<qqqQQ`` and their 32-byte digests, concatenated.
Writers write a private temporary file and ``os.replace`` it, so concurrent processes
only ever read a complete file; the last writer wins, and each writer's content is a
complete, valid cache. A missing, truncated or foreign file reads as empty. Failing to
write the cache is logged, never raised. Only files settled before they were read are
cached, so no cached digest can hide a later change behind an unchanged stat.

Limits: the proof of consistency rests on timestamps. It cannot see a single ``write()``
that began before the first stat and is still copying data while we read, when that
call lasts longer than the settle window (20 ms); nor a network filesystem whose
server clock runs far from ours. Writers that write in chunks or replace files by
renaming are caught.

Cancellation: :func:`ahash_path` checks for cancellation between directories and jobs
and waits for the pool's threads, which stop between files and between 1 MiB chunks.
POSIX only (directory fds).
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from itertools import starmap
from operator import attrgetter
from pathlib import Path

import anyio.from_thread
import anyio.to_thread

from kinetic._core import content_hash as ch
from kinetic._data import stat_cache
from kinetic._exceptions import DataError

__all__ = [
    "HashResult",
    "HashStats",
    "ahash_path",
    "ahash_tree",
    "default_cache_dir",
    "hash_path",
    "hash_tree",
]

logger = logging.getLogger(__name__)

_CHUNK = 1 << 20
# Files to read go in jobs of at most this many files or bytes (see hash_dir).
_BATCH_FILES = 64
_BATCH_BYTES = 4 << 20
# Jobs whose files average at least this size go to the thread pool; smaller files are
# read by the calling thread. Measured on 2 cores: 16-32 KiB files hash 0.7-0.9x as fast
# on two threads as on one (GIL contention), 64 KiB files 1.3-1.5x, 1 MiB+ files 1.9x.
_POOL_MIN_FILE_BYTES = 48 << 10
# The pool starts once this many bytes of such jobs are waiting: starting threads costs a
# few milliseconds on a busy machine, about what hashing 16 MiB on a second core saves.
_POOL_MIN_BYTES = 16 << 20
_ATTEMPTS = 2  # read a file changing under us once more, then give up
_SETTLE_ROUNDS = 3
_WAIT_POLL_S = 0.02  # how often a blocked wait checks for cancellation

_CACHE_SUBDIR = "hash-stat-cache-v1"
_CACHE_MAGIC = b"kinetic-hash-stat-cache-v1\n"

_OPEN_FILE = os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
_OPEN_DIR = os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY

# What must not change for a cached digest to stay valid, and how it is stored (packed,
# 40 bytes each: a cache costs little memory per file, loads without building a tuple per
# file, and an unchanged directory compares as one bytes): see kinetic._data.stat_cache.
_Key = stat_cache.StatKey
_KEY = stat_cache.STAT_KEY
_KEY_STRUCT = stat_cache.KEY_STRUCT
_KEY_LEN = stat_cache.KEY_LEN
_DIGEST_LEN = ch.DIGEST_SIZE
# A directory's cache record: its regular files' names in walk order, their packed stat
# keys and their digests, concatenated in the same order. The digests are exactly what the
# directory contributes to the hash of the tree.
_Record = tuple[list[str], bytes, bytes]
_Tree = dict[str, _Record]
# A directory's record while its files are being read: names, packed keys, digests (None:
# not read yet, or not cacheable). Compacted into a _Record at the end.
_Build = tuple[list[str], list[bytes], list[bytes | None]]
# Stats are taken this many entries at a time: C-level passes, bounded memory.
_STAT_CHUNK = 4096
_Checkpoint = Callable[[], None]
_MODE: Callable[[os.stat_result], int] = attrgetter("st_mode")


@dataclass(frozen=True, slots=True)
class HashStats:
    """What one hash call did.

    :ivar files: files in the tree (digests combined).
    :ivar cache_hits: digests taken from the stat cache without opening the file.
    :ivar files_read: files whose bytes were read (includes re-reads).
    :ivar bytes_read: bytes read from those files.
    :ivar cache_file: the stat cache file of this root, or ``None`` when caching is off.
    :ivar cache_saved: whether the call rewrote the cache file.
    """

    files: int
    cache_hits: int
    files_read: int
    bytes_read: int
    cache_file: Path | None
    cache_saved: bool


@dataclass(frozen=True, slots=True)
class HashResult:
    """A content hash and the statistics of the call that computed it."""

    digest: str
    stats: HashStats


def default_cache_dir() -> Path:
    """Return the stat cache directory: ``${KINETIC_CACHE_DIR:-~/.kinetic/cache}/hash-stat-cache-v1``.

    Read at each call, so tests and users may change the variable at any time.
    """
    return stat_cache.cache_base() / _CACHE_SUBDIR


def hash_path(path: str | os.PathLike[str]) -> str:
    """Return the content hash of a local file or directory (equal to the original's).

    Blocks the calling thread; the reads run on a private thread pool.

    :raises DataError: if the path does not exist, cannot be read, contains a dangling
        symlink or a special file, or a file kept changing while it was read.
    """
    return hash_tree(path).digest


async def ahash_path(path: str | os.PathLike[str]) -> str:
    """Return the content hash of a local file or directory, from a worker thread.

    No timeout of its own: hashing is bounded by the size of the tree. Cancellation is
    honoured between directories and jobs of files; in-flight reads stop between 1 MiB chunks
    and the call returns only after every thread it started has finished.

    :raises DataError: as :func:`hash_path`.
    """
    return (await ahash_tree(path)).digest


async def ahash_tree(
    path: str | os.PathLike[str],
    *,
    use_cache: bool = True,
    cache_dir: Path | None = None,
    max_workers: int | None = None,
) -> HashResult:
    """Async twin of :func:`hash_tree`, cancellable as :func:`ahash_path`.

    :raises DataError: as :func:`hash_path`.
    """
    work = partial(
        hash_tree,
        path,
        use_cache=use_cache,
        cache_dir=cache_dir,
        max_workers=max_workers,
        checkpoint=anyio.from_thread.check_cancelled,
    )
    return await anyio.to_thread.run_sync(work)


def hash_tree(
    path: str | os.PathLike[str],
    *,
    use_cache: bool = True,
    cache_dir: Path | None = None,
    max_workers: int | None = None,
    checkpoint: _Checkpoint | None = None,
) -> HashResult:
    """Hash a local file or directory and report what it took.

    :param path: the file or directory; relative paths are taken from the cwd.
    :param use_cache: read and update the persistent stat cache.
    :param cache_dir: the cache directory; :func:`default_cache_dir` when ``None``.
    :param max_workers: threads reading files; by default ``os.cpu_count()`` (at least 2).
    :param checkpoint: called between directories and jobs of files; whatever it raises aborts
        the call after the threads stopped (used for anyio cancellation).
    :raises DataError: as :func:`hash_path`.
    """
    root = os.path.abspath(os.fspath(path))
    now = time.time_ns()  # before the stat: see _walk
    try:
        st = os.stat(root)
    except FileNotFoundError:
        raise DataError(f"Data path does not exist: {root}") from None
    except OSError as exc:
        raise DataError(f"cannot read Data path {root}: {exc.strerror or exc}") from exc
    if stat.S_ISDIR(st.st_mode):
        kind = "dir"
    elif stat.S_ISREG(st.st_mode):
        kind = "file"
    else:
        raise DataError(f"Data path is neither a regular file nor a directory: {root}")

    cache = _StatCache.load(cache_dir or default_cache_dir(), kind, root) if use_cache else None
    workers = max_workers if max_workers is not None else max(2, os.cpu_count() or 2)
    run = _Run(root, cache, workers, checkpoint or _no_checkpoint)
    digest = run.hash_dir() if kind == "dir" else run.hash_file(st, now)
    saved = cache.save(run.new_tree) if cache is not None and run.dirty else False
    stats = HashStats(
        files=run.files,
        cache_hits=run.cache_hits,
        files_read=run.files_read,
        bytes_read=run.bytes_read,
        cache_file=cache.file if cache is not None else None,
        cache_saved=saved,
    )
    return HashResult(digest, stats)


def _no_checkpoint() -> None:
    pass


class _Stopped(Exception):
    """Raised in a pool thread when the call is being torn down; nobody waits for it."""


# A run of files to read, all in one directory: (its directory's record under
# construction, dir relpath, dir abspath, the walk's clock for it, indices of the files).
# Whoever reads it fills the record's keys and digests at those indices.
_Job = tuple[_Build, str, str, int, list[int]]
# A finished job: its digests concatenated, files read, bytes read.
_Done = tuple[bytes, int, int]
# What the calling thread combines, in walk order: digests known already, a job held
# back from the pool (see add_job), or the future of a job given to the pool.
_Pending = bytearray | _Job | Future[_Done]


class _Run:
    """State of one hash call.

    The calling thread walks, looks up the cache and combines digests; pool threads run
    :meth:`_do_job`, which writes only into the slots of its job in a record under
    construction and reads ``stop`` and ``local``. The calling thread reads those records
    only after every job finished.
    """

    def __init__(
        self, root: str, cache: _StatCache | None, workers: int, checkpoint: _Checkpoint
    ) -> None:
        self.root = root
        self.old_tree: _Tree = cache.tree if cache is not None else {}
        self.new_tree: _Tree = {}
        self.dirty = False  # new_tree differs from old_tree
        self.workers = max(1, workers)
        self.checkpoint = checkpoint
        self.stop = threading.Event()
        self.local = threading.local()
        self.files = 0
        self.cache_hits = 0
        self.files_read = 0
        self.bytes_read = 0

    # -- single file -------------------------------------------------------------------

    def hash_file(self, st: os.stat_result, now: int) -> str:
        # The original hashed a single file under its base name.
        abs_dir, name = os.path.split(self.root)
        self.files = 1
        packed = _KEY_STRUCT.pack(*_KEY(st))
        old = self.old_tree.get("")
        if old is not None and old[0] == [name] and old[1] == packed:
            self.cache_hits = 1
            self.new_tree[""] = old
            return ch.single_file_hash(old[2])
        self.dirty = True
        build: _Build = ([name], [packed], [None])
        digest = self._done(self._do_job((build, "", abs_dir, now, [0])))
        self._keep("", build)
        return ch.single_file_hash(digest)

    # -- directory ---------------------------------------------------------------------

    def hash_dir(self) -> str:
        dh = ch.dir_hasher()
        pending: deque[_Pending] = deque()
        builds: list[tuple[str, _Build]] = []
        pool: ThreadPoolExecutor | None = None

        held_bytes = 0

        def drain(limit: int) -> None:
            # Combine finished work at the head; block on (or read) the oldest job only
            # while more than `limit` items are in flight (bounded memory).
            while pending and (
                len(pending) > limit
                or isinstance(pending[0], bytearray)
                or (isinstance(pending[0], Future) and pending[0].done())
            ):
                item = pending.popleft()
                if isinstance(item, bytearray):
                    dh.update(item)
                elif isinstance(item, Future):
                    dh.update(self._done(self._wait(item)))
                else:
                    dh.update(self._done(self._do_job(item)))  # held back: read it here
                self.checkpoint()

        def add_digests(digests: bytes) -> None:
            if not pending:
                dh.update(digests)  # nothing ahead of them: combine at once
            elif isinstance(pending[-1], bytearray):
                pending[-1] += digests
            else:
                pending.append(bytearray(digests))  # keep their place behind the reads

        def add_job(job: _Job, nbytes: int) -> None:
            nonlocal pool, held_bytes
            if nbytes < _POOL_MIN_FILE_BYTES * len(job[4]):
                # Small files cost more GIL-held work (open, stat, close) than GIL-free
                # hashing: threads would only contend for the GIL. Read them here, while
                # the pool hashes the big ones.
                add_digests(self._done(self._do_job(job)))
            elif pool is not None:
                pending.append(pool.submit(self._do_job, job))
            else:
                # Starting threads takes milliseconds: hold big jobs back until there is
                # enough to hash for two cores to win that back. Less is read here.
                pending.append(job)
                held_bytes += nbytes
                if held_bytes >= _POOL_MIN_BYTES:
                    pool = ThreadPoolExecutor(self.workers, "kinetic-hash")
                    for i, item in enumerate(pending):
                        if isinstance(item, tuple):
                            pending[i] = pool.submit(self._do_job, item)
            self.checkpoint()
            drain(4 * self.workers)

        try:
            for rel_dir, abs_dir, now, names, keys in _walk(self.root):
                self.checkpoint()
                self.files += len(names)
                if not names:
                    continue
                old = self.old_tree.get(rel_dir)
                if old is not None and old[1] == keys and old[0] == names:
                    # An unchanged directory (the common case of a warm hash): two
                    # comparisons and one hash update, no per-file work at all.
                    self.cache_hits += len(names)
                    self.new_tree[rel_dir] = old
                    add_digests(old[2])
                    continue
                self.dirty = True
                packed = [keys[i : i + _KEY_LEN] for i in range(0, len(keys), _KEY_LEN)]
                build: _Build = (names, packed, [None] * len(names))
                builds.append((rel_dir, build))
                index = {n: j for j, n in enumerate(old[0])} if old is not None else {}
                run: list[int] = []
                run_bytes = 0
                for i, key in enumerate(_KEY_STRUCT.iter_unpack(keys)):
                    j = index.get(names[i])
                    if old is not None and j is not None:
                        k = j * _KEY_LEN
                        if old[1][k : k + _KEY_LEN] == packed[i]:
                            d = j * _DIGEST_LEN
                            digest = old[2][d : d + _DIGEST_LEN]
                            self.cache_hits += 1
                            build[2][i] = digest
                            if run:
                                add_job((build, rel_dir, abs_dir, now, run), run_bytes)
                                run, run_bytes = [], 0
                            add_digests(digest)
                            continue
                    run.append(i)
                    run_bytes += key[0]
                    # A job ends at this many files or bytes, whichever first: big enough
                    # to amortise the pool's per-task cost, small enough to spread work
                    # over the cores (a big file is a job of its own).
                    if len(run) >= _BATCH_FILES or run_bytes >= _BATCH_BYTES:
                        add_job((build, rel_dir, abs_dir, now, run), run_bytes)
                        run, run_bytes = [], 0
                if run:
                    add_job((build, rel_dir, abs_dir, now, run), run_bytes)
            drain(0)
        finally:
            if pool is not None:
                self.stop.set()  # a no-op on success: every job has finished by now
                pool.shutdown(wait=True, cancel_futures=True)
        for rel_dir, build in builds:
            self._keep(rel_dir, build)
        if len(self.new_tree) != len(self.old_tree):
            self.dirty = True  # directories came or went
        return dh.hexdigest()

    def _keep(self, rel_dir: str, build: _Build) -> None:
        """Store a finished record in the new tree, without the files it could not cache."""
        names, keys, digests = build
        kept = [(n, k, d) for n, k, d in zip(names, keys, digests, strict=True) if d is not None]
        if kept:
            self.new_tree[rel_dir] = (
                [n for n, _, _ in kept],
                b"".join(k for _, k, _ in kept),
                b"".join(d for _, _, d in kept),
            )

    def _wait(self, fut: Future[_Done]) -> _Done:
        while True:
            try:
                return fut.result(timeout=_WAIT_POLL_S)
            except TimeoutError:
                self.checkpoint()

    def _done(self, done: _Done) -> bytes:
        digests, files, nbytes = done
        self.files_read += files
        self.bytes_read += nbytes
        return digests

    # -- pool threads, and the calling thread for small files -----------------------------

    def _do_job(self, job: _Job) -> _Done:
        """Read the files of a job; fill their slots in its record; return their digests."""
        build, rel_dir, abs_dir, now, indices = job
        names, keys, digests = build
        buf: bytearray | None = getattr(self.local, "buf", None)
        if buf is None:  # the calling thread: allocate once, not per job
            buf = self.local.buf = bytearray(_CHUNK)
        view = memoryview(buf)
        out: list[bytes] = []
        nbytes = 0
        rel_prefix = ch.join_relpath(rel_dir, "")  # hoisted out of the per-file loop
        abs_prefix = f"{abs_dir}/"
        for i in indices:
            if self.stop.is_set():
                raise _Stopped
            name = names[i]
            key: _Key = _KEY_STRUCT.unpack(keys[i])
            settled = ch.is_settled(key[1], key[2], now)
            digest, cache_key, n = self._read_file(
                rel_prefix + name, abs_prefix + name, key, settled, view
            )
            out.append(digest)
            nbytes += n
            if cache_key is not None:
                keys[i] = _KEY_STRUCT.pack(*cache_key)
                digests[i] = digest
            # else: digests[i] stays None, the file is left out of the cache
        return b"".join(out), len(indices), nbytes

    def _read_file(
        self, rel: str, path: str, walk_key: _Key, walk_settled: bool, view: memoryview
    ) -> tuple[bytes, _Key | None, int]:
        """Read and digest one file; return its digest, cache entry and bytes read.

        The stat taken by the walk serves as the "before" stat when it was settled: a
        change or a replacement since then must show in the fstat after the read. Any
        other case (a racy file, a second attempt) fstats the fd first and settles it.

        :raises DataError: the file vanished, cannot be read, is not a regular file, or
            changed during both attempts.
        """
        total_read = 0
        for attempt in range(_ATTEMPTS):
            try:
                fd = os.open(path, _OPEN_FILE)
            except FileNotFoundError:
                raise DataError(f"file vanished while being hashed: {path}") from None
            except OSError as exc:
                raise DataError(f"cannot read {path}: {exc.strerror or exc}") from exc
            try:
                if attempt == 0 and walk_settled:
                    key, cacheable = walk_key, True
                else:
                    settled = self._settle(fd, path)
                    if settled is None:
                        continue  # still being written: counts as a failed attempt
                    key, cacheable = _KEY(settled[0]), settled[1]
                h = ch.file_hasher(rel)
                size = key[0]
                done = 0
                # Stop at the size fstat reported: growth shows in the second fstat anyway,
                # and skipping the EOF read saves a syscall per small file.
                while done < size:
                    if self.stop.is_set():
                        raise _Stopped
                    n = os.readv(fd, [view])
                    if not n:
                        break
                    h.update(view[:n])
                    done += n
                after = os.fstat(fd)
            except OSError as exc:
                raise DataError(f"cannot read {path}: {exc.strerror or exc}") from exc
            finally:
                os.close(fd)
            total_read += done
            if done == size and key == _KEY(after):
                return h.digest(), key if cacheable else None, total_read
        raise DataError(
            f"file changed while being hashed ({_ATTEMPTS} attempts): {path}; "
            "wait until whatever writes it has finished, then retry"
        )

    def _settle(self, fd: int, path: str) -> tuple[os.stat_result, bool] | None:
        """Return the fd's stat once any further change must show in it, and whether a
        digest read now may be cached; ``None`` if the file keeps changing.

        A change in the same timestamp tick as the previous one leaves mtime and ctime
        as they were, so a file changed less than a tick ago is waited on first; then an
        equal stat before and after the read proves the bytes read are one state.
        Timestamps in the future (clock skew, extracted archives) cannot collide with a
        change made now, but they are not cached: that proof is all we have for them.
        """
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DataError(f"not a regular file: {path}")
        for _ in range(_SETTLE_ROUNDS):
            now = time.time_ns()
            if ch.is_settled(st.st_mtime_ns, st.st_ctime_ns, now):
                return st, True
            window = ch.racy_window_ns(st.st_mtime_ns, st.st_ctime_ns)
            latest = max(st.st_mtime_ns, st.st_ctime_ns)
            if latest > now + window:
                return st, False
            if self.stop.is_set():
                raise _Stopped
            time.sleep((latest + window - now) / 1e9)
            st = os.fstat(fd)
        return None


def _walk(root: str) -> Iterator[tuple[str, str, int, list[str], bytes]]:
    """Yield ``(dir relpath, dir abspath, now, file names, packed stat keys)`` in walk order.

    Mirrors ``os.walk(root, followlinks=False)`` with sorted names: symlinks to
    directories are listed as directories and not descended; a symlinked file is a file.
    Unlike ``os.walk``, an unreadable directory raises instead of silently dropping its
    files from the hash. ``now`` is the wall clock read before the directory was listed:
    a stat settled at ``now`` was settled when it was taken.

    :raises DataError: unreadable directory, dangling symlink, special file, or a
        directory replaced while walking.
    """
    stack = [("", root)]
    while stack:
        rel_dir, abs_dir = stack.pop()
        try:
            # The root may be a symlink (the original followed it); below the root,
            # O_NOFOLLOW refuses a directory swapped for a symlink since we listed it.
            fd = os.open(abs_dir, _OPEN_DIR | (os.O_NOFOLLOW if rel_dir else 0))
        except OSError as exc:
            raise DataError(f"cannot read directory {abs_dir}: {exc.strerror or exc}") from exc
        try:
            now = time.time_ns()
            names = os.listdir(fd)
            names.sort()
            subdirs: list[str] = []
            packed = _stat_leaf(fd, names)
            if packed is not None:
                files, keys = names, packed
            else:
                files, keys, subdirs = _classify(fd, abs_dir, names)
        except OSError as exc:
            raise DataError(f"cannot read directory {abs_dir}: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)
        yield rel_dir, abs_dir, now, files, keys
        for name in reversed(subdirs):
            stack.append((ch.join_relpath(rel_dir, name), f"{abs_dir}/{name}"))


def _stat_leaf(fd: int, names: list[str]) -> bytes | None:
    """Return the packed stat keys of ``names`` if all are regular files, else ``None``.

    The fast path of the walk: most directories of a dataset hold only files, and this
    stats them in C-level passes without a Python step per file.
    """
    stat_at = partial(os.stat, dir_fd=fd)
    parts: list[bytes] = []
    for start in range(0, len(names), _STAT_CHUNK):
        try:
            sts = list(map(stat_at, names[start : start + _STAT_CHUNK]))
        except OSError:
            return None  # _classify finds the culprit and names it
        if not all(map(stat.S_ISREG, map(_MODE, sts))):
            return None
        parts.append(b"".join(starmap(_KEY_STRUCT.pack, map(_KEY, sts))))
    return b"".join(parts)


def _classify(fd: int, abs_dir: str, names: list[str]) -> tuple[list[str], bytes, list[str]]:
    """Split a directory's sorted entries into files (with packed stat keys) and subdirs.

    :raises DataError: dangling symlink, symlink loop, special file, vanished entry.
    """
    files: list[str] = []
    keys: list[bytes] = []
    subdirs: list[str] = []
    for name in names:
        try:
            st = os.stat(name, dir_fd=fd)  # follows symlinks: a symlinked file is a file
            is_link = stat.S_ISDIR(st.st_mode) and stat.S_ISLNK(
                os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
            )
        except FileNotFoundError:
            raise DataError(
                f"dangling symlink or file removed while hashing: {abs_dir}/{name}"
            ) from None
        except OSError as exc:
            raise DataError(f"cannot stat {abs_dir}/{name}: {exc.strerror or exc}") from exc
        if stat.S_ISREG(st.st_mode):
            files.append(name)
            keys.append(_KEY_STRUCT.pack(*_KEY(st)))
        elif stat.S_ISDIR(st.st_mode):
            if not is_link:  # os.walk lists a symlinked directory but does not descend
                subdirs.append(name)
        else:
            raise DataError(f"not a regular file: {abs_dir}/{name}")
    return files, b"".join(keys), subdirs


class _StatCache:
    """The persistent stat cache of one root (format in the module docstring)."""

    def __init__(self, file: Path, kind: str, root: str, tree: _Tree) -> None:
        self.file = file
        self.kind = kind
        self.root = root
        self.tree = tree

    @classmethod
    def load(cls, cache_dir: Path, kind: str, root: str) -> _StatCache:
        file = stat_cache.cache_file(cache_dir, f"{kind}\0{root}")
        return cls(file, kind, root, _read_cache(file, kind, root))

    def save(self, tree: _Tree) -> bool:
        """Write ``tree`` atomically; return whether it was written."""
        return stat_cache.write_blob(
            self.file, _CACHE_MAGIC, (self.kind, self.root, ch.SEP, tree), what="hash stat cache"
        )


def _read_cache(file: Path, kind: str, root: str) -> _Tree:
    obj = stat_cache.read_blob(file, _CACHE_MAGIC)
    if not (
        isinstance(obj, tuple)
        and len(obj) == 4
        and obj[:3] == (kind, root, ch.SEP)
        and isinstance(obj[3], dict)
    ):
        return {}
    tree: _Tree = obj[3]
    # The checksum proves the bytes are what a writer meant; check the shape too (one
    # test per directory), so a writer of another layout cannot crash the walk.
    for record in tree.values():
        if not (
            type(record) is tuple
            and len(record) == 3
            and type(record[0]) is list
            and type(record[1]) is bytes
            and type(record[2]) is bytes
            and len(record[1]) == _KEY_LEN * len(record[0])
            and len(record[2]) == _DIGEST_LEN * len(record[0])
        ):
            return {}
    return tree
