"""Context archives, extracted once per content address and shared by the jobs of a machine.

Theory of operation
-------------------
The local backend names a cache directory (``{local root}/contexts``) in the job's
environment. In it::

    .lock               flock'ed exclusively while extracting or evicting (one at a time)
    {sha}               symlink to the current generation of the context {sha}
    {sha}.{gen}/        an extracted tree: read-only, but for its ``__pycache__`` folders
    {sha}.{gen}.json    its size, and the stat of its directories and top-level files
    {sha}.{gen}.lock    held shared (``flock``) by every process using the tree; its
                        mtime is the tree's last use

**Claim** (:func:`claim`): follow ``{sha}``, take the generation's lock shared, check the
lock file is still the one at its path (an evictor unlinks it before letting go), check
the tree is intact (below), touch the lock: the tree is ours for as long as this process
(and its forked children) lives. Otherwise take ``.lock`` and, unless someone else just
did, extract a new generation into a temporary directory, make it read-only, rename it
into place, take its lock shared and switch ``{sha}`` to it (an atomic rename). Twenty
jobs starting at once extract once: the others wait on ``.lock``, then claim.

**Evict** (after an extraction, under ``.lock``): generations no longer current, then
the least recently used, until the cache is below its bound
(``KINETIC_CONTEXT_CACHE_MB``, default 2048). A generation whose lock cannot be taken
exclusively at once is in use and kept, so eviction never pulls a tree from under a
running job. An evicted tree is renamed aside under the lock and deleted after it.

**Intact.** A tree is read-only, so a job of another user, or one that is not root,
cannot change it. Root ignores permissions: a claim therefore compares the stat of every
directory and top-level file with the one recorded at extraction, and a tree that a job
wrote into (a file created, removed or renamed anywhere, a top-level file changed) is
replaced by a fresh generation for the jobs that follow. What this cannot see: root
rewriting, in place, an existing file below the top level.

**Workspace** (:func:`link_workspace`): each job's working directory is its own real
directory holding a symlink to each top-level entry of the tree (real directories down
to the job's relative cwd, each with links to its entries), so files the job creates
there are its own and are never seen by another job, while reading the project's files
by relative path works as before. ``sys.path`` points into the tree itself.

Runner start-up stays stdlib-only: :mod:`zipfile` is imported only to extract.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

CACHE_ENV = "KINETIC_CONTEXT_CACHE"
"""The variable naming the shared cache directory (set by the local backend)."""

BOUND_ENV = "KINETIC_CONTEXT_CACHE_MB"
_DEFAULT_BOUND_MB = 2048
_ATTEMPTS = 8
_HEX = frozenset("0123456789abcdef")
_PYCACHE = "__pycache__"
# Locks of the trees this process uses: released when it exits.
_HELD: list[int] = []


class UnpackError(Exception):
    """The archive is not one this runner will extract."""


def claim(cache: Path, sha: str, fetch: Callable[[], bytes]) -> Path:
    """Return the extracted tree of context ``sha``, held for this process's lifetime.

    :param fetch: returns the verified archive bytes; called only to extract.
    :raises UnpackError: the archive is unsafe or corrupt.
    :raises OSError: the cache cannot be used (the caller extracts privately instead).
    """
    if not _is_hex(sha, 64):
        raise UnpackError(f"not a content address: {sha!r}")
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    for _ in range(_ATTEMPTS):
        gen = _current(cache, sha)
        if gen is not None:
            tree = _use(cache, gen)
            if tree is not None:
                return tree
        with _exclusive(cache / ".lock"):
            if _current(cache, sha) != gen:
                continue  # someone else extracted meanwhile: claim theirs
            tree = _extract_generation(cache, sha, fetch)
            _evict(cache, keep=tree.name)
            return tree
    raise OSError(f"context cache {cache} keeps changing under this job")


def link_workspace(tree: Path, workspace: Path, cwd: str | None) -> Path:
    """Fill the job's own ``workspace`` with links into ``tree``; return the job's cwd.

    Real directories lead down to ``cwd`` (relative to the root), each holding links to
    the entries of its counterpart in the tree, so writing in the cwd stays private.
    """
    _link_entries(tree, workspace)
    src, dst = tree, workspace
    for part in (cwd or "").split("/"):
        if not part or part == ".":
            continue
        src, dst = src / part, dst / part
        if dst.is_symlink():
            dst.unlink()
        dst.mkdir(exist_ok=True)
        if src.is_dir():
            _link_entries(src, dst)
    return dst


def extract(archive: bytes, dest: Path, *, shared: bool = False) -> tuple[int, int]:
    """Extract ``archive`` into the existing directory ``dest``; return (files, bytes).

    Files keep the archive's modes (``shared``: minus write permission).

    :raises UnpackError: a member would land outside ``dest``, or the zip is corrupt.
    """
    import io
    import zipfile

    umask = os.umask(0)
    os.umask(umask)
    made: set[str] = {""}
    files = total = 0
    try:
        with zipfile.ZipFile(io.BytesIO(archive)) as zf:
            infos = zf.infolist()
            for info in infos:
                _check_member(info.filename)
            for info in infos:
                name = info.filename.rstrip("/")
                if info.is_dir():
                    _make_dirs(dest, name, made)
                    continue
                _make_dirs(dest, name.rpartition("/")[0], made)
                mode = (info.external_attr >> 16) & 0o777 or 0o644
                if shared:
                    mode = (mode & ~0o222) | 0o444
                data = zf.read(info)
                fd = os.open(dest / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
                try:
                    if mode & umask:
                        os.fchmod(fd, mode)
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                finally:
                    os.close(fd)
                files += 1
                total += len(data)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as exc:
        raise UnpackError(f"corrupt context archive: {exc}") from exc
    return files, total


def remove_tree(root: Path) -> None:
    """Delete a (possibly read-only) tree, ignoring errors."""
    from runner.fs import remove_tree as remove

    for dirpath, dirnames, _ in os.walk(root):
        for name in dirnames:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(dirpath, name), 0o700, follow_symlinks=False)
    with contextlib.suppress(OSError):
        os.chmod(root, 0o700)
    remove(root)


# -- claim ---------------------------------------------------------------------------


def _is_hex(text: str, length: int) -> bool:
    return len(text) == length and _HEX.issuperset(text)


def _is_generation(name: str) -> bool:
    """``{sha256}.{8 hex digits}``: an extracted tree (not a lock, meta or temporary)."""
    return len(name) == 73 and name[64] == "." and _is_hex(name[:64] + name[65:], 72)


def _current(cache: Path, sha: str) -> str | None:
    try:
        gen = os.readlink(cache / sha)
    except OSError:
        return None
    return gen if _is_generation(gen) else None


def _use(cache: Path, gen: str) -> Path | None:
    """Hold generation ``gen`` if it is there and intact; else ``None``."""
    lock_path = cache / f"{gen}.lock"
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return None  # evicted
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        if os.fstat(fd).st_ino != os.stat(lock_path).st_ino:
            raise FileNotFoundError  # evicted while we waited
        tree = cache / gen
        if not _intact(cache, gen):
            raise FileNotFoundError
        os.utime(fd)  # last use, for eviction
    except FileNotFoundError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    _HELD.append(fd)
    return tree


def _intact(cache: Path, gen: str) -> bool:
    try:
        meta = json.loads((cache / f"{gen}.json").read_bytes())
        tree = cache / gen
        for rel, mtime, ctime in meta["dirs"]:
            st = os.stat(tree / rel if rel else tree)
            if (st.st_mtime_ns, st.st_ctime_ns) != (mtime, ctime):
                return False
        for name, size, mtime, ctime in meta["top"]:
            st = os.stat(tree / name)
            if (st.st_size, st.st_mtime_ns, st.st_ctime_ns) != (size, mtime, ctime):
                return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _extract_generation(cache: Path, sha: str, fetch: Callable[[], bytes]) -> Path:
    """Extract a new generation of ``sha`` and make it current. Call under ``.lock``."""
    _sweep(cache)
    archive = fetch()
    gen = f"{sha}.{os.urandom(4).hex()}"
    tmp = cache / f".tmp-{gen}"
    tmp.mkdir(mode=0o755)
    try:
        files, nbytes = extract(archive, tmp, shared=True)
        dirs = _seal(tmp)
        tree = cache / gen
        os.rename(tmp, tree)
    except BaseException:
        remove_tree(tmp)
        raise
    os.chmod(tree, 0o555)
    meta = {
        "sha256": sha,
        "files": files,
        "bytes": nbytes,
        "dirs": [[rel, *_times(tree / rel if rel else tree)] for rel in dirs],
        "top": [
            [entry.name, entry.stat().st_size, *_times(Path(entry.path))]
            for entry in os.scandir(tree)
            if entry.is_file(follow_symlinks=False)
        ],
    }
    from runner.fs import atomic_write

    atomic_write(cache / f"{gen}.json", json.dumps(meta).encode())
    fd = os.open(cache / f"{gen}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)  # ours before anyone can evict it
    _HELD.append(fd)
    link = cache / f".tmp-link-{gen}"
    os.symlink(gen, link)
    os.replace(link, cache / sha)
    return tree


def _times(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_mtime_ns, st.st_ctime_ns


def _seal(tree: Path) -> list[str]:
    """Make ``tree`` read-only but for a ``__pycache__`` in each folder of modules (so
    imports share their bytecode); return its directories but the root, which the
    caller seals after renaming it, and the ``__pycache__`` folders."""
    dirs: list[str] = []
    for dirpath, dirnames, filenames in os.walk(tree):
        if any(name.endswith(".py") for name in filenames) and _PYCACHE not in dirnames:
            os.mkdir(os.path.join(dirpath, _PYCACHE), 0o755)
        dirnames[:] = [d for d in dirnames if d != _PYCACHE]
        rel = os.path.relpath(dirpath, tree)
        dirs.append("" if rel == "." else rel)
    for rel in reversed(dirs):
        if rel:
            os.chmod(tree / rel, 0o555)
    return dirs


# -- eviction ------------------------------------------------------------------------


def _bound() -> int:
    try:
        return int(float(os.environ.get(BOUND_ENV, _DEFAULT_BOUND_MB)) * (1 << 20))
    except ValueError:
        return _DEFAULT_BOUND_MB << 20


def _sweep(cache: Path) -> None:
    """Remove what dead extractors left (``.tmp-*``). Call under ``.lock``."""
    for entry in os.scandir(cache):
        if entry.name.startswith(".tmp-"):
            if entry.is_dir(follow_symlinks=False):
                remove_tree(Path(entry.path))
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def _evict(cache: Path, keep: str) -> None:
    """Evict as the module docstring says. Call under ``.lock``."""
    names = os.listdir(cache)
    current = {}
    for name in names:
        if len(name) == 64 and (gen := _current(cache, name)) is not None:
            current[gen] = name
    entries: list[tuple[bool, int, int, str]] = []
    for name in names:
        if not _is_generation(name) or name == keep:
            continue
        try:
            size = int(json.loads((cache / f"{name}.json").read_bytes())["bytes"])
        except (OSError, ValueError, KeyError, TypeError):
            size = 0
        try:
            used = os.stat(cache / f"{name}.lock").st_mtime_ns
        except OSError:
            used = 0
        entries.append((name in current, used, size, name))
    total = sum(e[2] for e in entries) + _size_of(cache, keep)
    bound = _bound()
    trash: list[Path] = []
    for is_current, _, size, name in sorted(entries):
        if is_current and total <= bound:
            break
        gone = _evict_one(cache, name, current.get(name))
        if gone is not None:
            trash.append(gone)
            total -= size
    for path in trash:
        remove_tree(path)


def _size_of(cache: Path, gen: str) -> int:
    try:
        return int(json.loads((cache / f"{gen}.json").read_bytes())["bytes"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _evict_one(cache: Path, gen: str, sha: str | None) -> Path | None:
    """Move generation ``gen`` aside unless a process uses it; return where it went."""
    lock_path = cache / f"{gen}.lock"
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # in use by a running job
        if sha is not None and _current(cache, sha) == gen:
            os.unlink(cache / sha)
        trash: Path | None = cache / f".tmp-trash-{gen}"
        try:
            os.rename(cache / gen, str(trash))
        except FileNotFoundError:
            trash = None
        for leftover in (cache / f"{gen}.json", lock_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)
        return trash
    finally:
        os.close(fd)


# -- files ---------------------------------------------------------------------------


def _check_member(name: str) -> None:
    parts = name.rstrip("/").split("/")
    if name.startswith("/") or "\\" in name or "\0" in name or any(p in ("", "..") for p in parts):
        raise UnpackError(f"context archive member escapes: {name!r}")


def _make_dirs(dest: Path, rel: str, made: set[str]) -> None:
    if rel in made:
        return
    parent = rel.rpartition("/")[0]
    _make_dirs(dest, parent, made)
    with contextlib.suppress(FileExistsError):
        os.mkdir(dest / rel, 0o755)
    made.add(rel)


def _link_entries(src: Path, dst: Path) -> None:
    for name in os.listdir(src):
        if name != _PYCACHE:
            os.symlink(src / name, dst / name)


def warn(message: str) -> None:
    """One line on the job's stderr."""
    print(f"kinetic runner: {message}", file=sys.stderr)
