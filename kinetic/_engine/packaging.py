"""Turn a call into artifacts: the pickled payload and the context archive.

The context archive is the user's project (the *package root*) minus what is
ignored (:mod:`kinetic._core.context_rules`), as a deterministic zip, so equal
trees give equal bytes and one content address: an unchanged tree is stored
once. An unchanged tree is not even read again: the stat cache of
:mod:`kinetic._engine.context_files` gives its content address from one ``stat``
per file; the bytes are rebuilt only when a storage lacks them. Zipping and
pickling are CPU work and run in worker threads; cloudpickle's by-value registry
is process-global, so every use of it holds one lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import sys
import threading
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio.to_thread
import cloudpickle

from kinetic._core.context_rules import KINETICIGNORE, ROOT_MARKERS
from kinetic._core.functions import name_arguments
from kinetic._data.stat_cache import KEY_STRUCT, STAT_KEY
from kinetic._engine.context_files import (
    ContextFile,
    Scan,
    largest_dirs,
    scan,
)
from kinetic._engine.tree_watch import TreeWatch
from kinetic._exceptions import ConfigError, SerializationError
from kinetic._storage.base import Storage
from runner import protocol

logger = logging.getLogger(__name__)

PICKLE_LOCK = threading.Lock()
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
_MAX_CONTEXT_BYTES = int(os.environ.get("KINETIC_MAX_CONTEXT_MB", "1024")) << 20
# A context this big (bytes or files) is named once per process and root: it travels
# with every job.
NOTICE_BYTES = 50 << 20
NOTICE_FILES = 5_000


@dataclass(frozen=True)
class ContextArchive:
    """A zipped package root and its SHA-256.

    :ivar data: the archive's bytes; ``None`` when the stat cache proved the tree
        unchanged and nothing needed them yet (:func:`astore_context` rebuilds them).
    :ivar size: the archive's length in bytes.
    :ivar file_count: files in it.
    :ivar total_bytes: their size before compression.
    """

    root: Path
    data: bytes | None
    sha256: str
    size: int = 0
    file_count: int = 0
    total_bytes: int = 0


def function_source_dir(fn: Callable[..., Any]) -> Path:
    """The directory of the file that defines ``fn`` (the cwd when it has none)."""
    target = getattr(fn, "__func__", fn)
    module = sys.modules.get(getattr(target, "__module__", "") or "")
    filename = getattr(module, "__file__", None)
    if filename is None:
        code = getattr(target, "__code__", None)
        filename = getattr(code, "co_filename", None)
    if filename and os.path.exists(filename):
        return Path(filename).resolve().parent
    return Path.cwd().resolve()


def find_package_root(start: Path, environ: Mapping[str, str] = os.environ) -> Path:
    """Find the project directory to ship, starting from the function's directory.

    ``KINETIC_PACKAGE_ROOT`` wins. Otherwise leave any ``__init__.py`` package
    (so the package itself is importable in the job), then take the nearest
    ancestor holding a project marker (``pyproject.toml``, ``requirements.txt``,
    ``setup.py``, ``setup.cfg``, ``.git``); without one, the escaped directory.

    :raises ConfigError: if ``KINETIC_PACKAGE_ROOT`` is not a directory.
    """
    override = environ.get("KINETIC_PACKAGE_ROOT")
    if override:
        root = Path(override).expanduser().resolve()
        if not root.is_dir():
            raise ConfigError(f"KINETIC_PACKAGE_ROOT={override!r} is not a directory")
        return _not_home(root, start, environ)
    here = start.resolve()
    while (here / "__init__.py").exists() and here.parent != here:
        here = here.parent
    for candidate in (here, *here.parents):
        if any((candidate / marker).exists() for marker in ROOT_MARKERS):
            return _not_home(candidate, start, environ)
    return _not_home(here, start, environ)


def _not_home(root: Path, start: Path, environ: Mapping[str, str]) -> Path:
    """``root``, unless it is the home directory or above it: a job's copy of the project
    would hold every key, token and dotfile there (a dotfiles repository's ``.git`` at
    HOME makes HOME the root of every script below it that has no marker of its own).

    :raises ConfigError: naming how to mark the project.
    """
    home_text = environ.get("HOME")
    if not home_text:
        return root
    home = Path(home_text).resolve()
    if root != home and root not in home.parents:
        return root
    where = start.resolve()
    marker_dir = where if where != root else Path(home_text) / "myproject"
    raise ConfigError(
        f"the project to ship with the job would be {root}, "
        f"{'your home directory' if root == home else 'above your home directory'}: "
        "every key and dotfile there would travel with the job. Mark the project's own "
        f"directory with a pyproject.toml or requirements.txt (for example in {marker_dir}), "
        "or set KINETIC_PACKAGE_ROOT to it"
    )


def build_context_archive(root: Path, files: list[ContextFile]) -> ContextArchive:
    """Zip ``files`` deterministically (sorted, fixed timestamps). Blocking: call in a thread.

    :raises ConfigError: when the archive would exceed ``KINETIC_MAX_CONTEXT_MB``.
    """
    return _build(root, files)[0]


def _check_size(root: Path, total: int) -> None:
    if total > _MAX_CONTEXT_BYTES:
        raise ConfigError(
            f"the project at {root} is larger than {_MAX_CONTEXT_BYTES >> 20} MB; "
            f"exclude files with {KINETICIGNORE} or .gitignore, pass big inputs as "
            "kinetic.Data, or set KINETIC_PACKAGE_ROOT (`kinetic context` lists what travels)"
        )


def _build(root: Path, files: list[ContextFile]) -> tuple[ContextArchive, list[str]]:
    """The archive, and the files whose bytes may not be those of the stat the walk saw.

    Each file is read through one fd whose ``fstat`` after the read must equal the
    walk's stat key; a file that changed, or vanished (left out, as before), is named.
    """
    _check_size(root, sum(f.size for f in files))
    unproven: list[str] = []
    total = 0
    count = 0
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for f in files:
            try:
                with open(f.path, "rb") as fh:
                    data = fh.read()
                    after = KEY_STRUCT.pack(*STAT_KEY(os.fstat(fh.fileno())))
            except OSError:
                unproven.append(f.relpath)
                continue  # removed since it was listed
            if after != f.key:
                unproven.append(f.relpath)
            info = zipfile.ZipInfo(f.relpath, date_time=_ZIP_EPOCH)
            info.external_attr = (f.mode & 0o777) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data, compresslevel=1)
            total += len(data)
            count += 1
    data = buf.getvalue()
    archive = ContextArchive(
        root=root,
        data=data,
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        file_count=count,
        total_bytes=total,
    )
    return archive, unproven


# The last archive built per root in this process, bytes included: a storage that
# lacks it gets it without a rebuild. Older states of a tree are not coming back.
_ARCHIVES: dict[Path, ContextArchive] = {}
_ARCHIVES_LOCK = threading.Lock()
_NOTICED: set[Path] = set()


def context_archive(
    root: Path, *, exclude: tuple[Path, ...] = (), rebuild: bool = False
) -> ContextArchive:
    """The archive of ``root``: the one of the last call when the tree's watch saw no
    change since (no walk at all), else from the stat cache when no file changed.
    Blocking.

    :param rebuild: zip the tree even when the stat cache knows its address (a storage
        lacks the bytes).
    :raises ConfigError: when the archive would exceed ``KINETIC_MAX_CONTEXT_MB``.
    """
    watched = (
        None if os.environ.get("KINETIC_NO_WATCH") else _root_watch(Path(os.path.realpath(root)))
    )
    if watched is None:
        return _walked_archive(root, exclude, rebuild, None)[0]
    key = frozenset(map(str, exclude))
    with watched.lock:
        # Read before the walk: a change during it makes the next call walk again.
        generation = watched.watch.generation()
        known = watched.archives.get(key)
        if known is not None and known[0] == generation:
            archive = known[1]
            if not rebuild or archive.data is not None:
                _check_size(archive.root, archive.total_bytes)
                return archive
        archive, walk = _walked_archive(root, exclude, rebuild, watched.watch)
        watched.archives.pop(key, None)
        if walk.watched:
            watched.archives[key] = (generation, archive)
            while len(watched.archives) > _ARCHIVES_PER_ROOT:
                watched.archives.pop(next(iter(watched.archives)))
        return archive


def _walked_archive(
    root: Path, exclude: tuple[Path, ...], rebuild: bool, watch: TreeWatch | None
) -> tuple[ContextArchive, Scan]:
    walk = scan(root, exclude=exclude, watch=watch)
    _check_size(walk.root, walk.total_bytes)
    _notice(walk)
    cached = None if rebuild else walk.cached_result
    if cached is not None:
        sha, size = cached
        with _ARCHIVES_LOCK:
            known = _ARCHIVES.get(walk.root)
        data = known.data if known is not None and known.sha256 == sha else None
        archive = ContextArchive(walk.root, data, sha, size, walk.file_count, walk.total_bytes)
        return archive, walk
    archive, unproven = _build(walk.root, walk.files())
    walk.save((archive.sha256, archive.size), unproven)
    with _ARCHIVES_LOCK:
        _ARCHIVES[walk.root] = archive
    return archive, walk


@dataclass
class _WatchedRoot:
    """A package root's watch, and the archives it vouches for (per set of excludes):
    each with the watch's generation read before the walk that found it."""

    watch: TreeWatch
    lock: threading.Lock = field(default_factory=threading.Lock)
    archives: dict[frozenset[str], tuple[int, ContextArchive]] = field(default_factory=dict)


# One inotify instance per root (the kernel allows each user about 128): the roots a
# process submits from are few; the oldest is let go beyond the bound.
_WATCHED_ROOTS: dict[Path, _WatchedRoot | None] = {}
_WATCHED_LOCK = threading.Lock()
_MAX_WATCHED_ROOTS = 16
_ARCHIVES_PER_ROOT = 8


def _root_watch(root: Path) -> _WatchedRoot | None:
    """The watch of ``root`` (opened on first use), or ``None`` where there is none."""
    with _WATCHED_LOCK:
        if root in _WATCHED_ROOTS:
            return _WATCHED_ROOTS[root]
        watch = TreeWatch.open()
        watched = _WatchedRoot(watch) if watch is not None else None
        _WATCHED_ROOTS[root] = watched
        while len(_WATCHED_ROOTS) > _MAX_WATCHED_ROOTS:
            old = _WATCHED_ROOTS.pop(next(iter(_WATCHED_ROOTS)))
            if old is not None:
                old.watch.close()
        return watched


def _forget_watches() -> None:
    """In a forked child: the inotify instances are the parent's (one queue, two
    readers would each miss what the other read), so the child starts afresh."""
    for watched in _WATCHED_ROOTS.values():
        if watched is not None:
            watched.watch.close()
    _WATCHED_ROOTS.clear()


os.register_at_fork(after_in_child=_forget_watches)


async def acontext_archive(root: Path, *, exclude: tuple[Path, ...] = ()) -> ContextArchive:
    """:func:`context_archive` in a worker thread."""
    return await anyio.to_thread.run_sync(partial(context_archive, root, exclude=exclude))


async def astore_context(
    storage: Storage, root: Path, *, exclude: tuple[Path, ...] = ()
) -> ContextArchive:
    """The archive of ``root``, stored under its content address unless already there.

    Returns the archive actually stored: when the bytes must be rebuilt and the tree
    changed since it was walked, that is a newer one, with its own address.

    :raises ConfigError: when the archive would exceed ``KINETIC_MAX_CONTEXT_MB``.
    :raises StorageError: when storing fails.
    """
    archive = await acontext_archive(root, exclude=exclude)
    return await astore_archive(storage, archive, exclude=exclude)


# (storage URL, context key) known to be stored: contexts are content-addressed and
# Kinetic never deletes one, so a submission of an unchanged tree needs no lookup.
_STORED: set[tuple[str, str]] = set()


async def astore_archive(
    storage: Storage, archive: ContextArchive, *, exclude: tuple[Path, ...] = ()
) -> ContextArchive:
    """Store ``archive`` (found by :func:`context_archive` for its root and ``exclude``)
    under its content address unless it is known to be there; return what is stored.

    :raises ConfigError: when a rebuilt archive would exceed ``KINETIC_MAX_CONTEXT_MB``.
    :raises StorageError: when storing fails.
    """
    known = (storage.url, protocol.context_key(archive.sha256))
    if known in _STORED:
        return archive
    if await storage.exists(known[1]):
        _STORED.add(known)
        return archive
    if archive.data is None:
        archive = await anyio.to_thread.run_sync(
            partial(context_archive, archive.root, exclude=exclude, rebuild=True)
        )
    assert archive.data is not None  # a rebuilt archive always holds its bytes
    key = protocol.context_key(archive.sha256)
    await storage.write(key, archive.data)
    _STORED.add((storage.url, key))
    return archive


def _notice(walk: Scan) -> None:
    """Name a big context, and the files that look like secrets, once per process and
    root: the context travels with every job."""
    big = walk.total_bytes > NOTICE_BYTES or walk.file_count > NOTICE_FILES
    left_out, kept = walk.secrets()
    if not (big or left_out or kept):
        return
    with _ARCHIVES_LOCK:
        if walk.root in _NOTICED:
            return
        _NOTICED.add(walk.root)
    if left_out:
        logger.warning(
            "%s",
            _listed(f"left out what looks like secrets in {walk.root}", left_out)
            + f" (to ship one on purpose, re-include it with '!NAME' in {walk.root / KINETICIGNORE})",
        )
    if kept:
        logger.warning(
            "%s",
            _listed(
                f"shipping what looks like secrets in {walk.root}, as "
                f"{walk.root / KINETICIGNORE} re-includes it",
                kept,
            ),
        )
    if big:
        logger.warning("%s", context_notice(walk))


def _listed(head: str, paths: list[str], most: int = 20) -> str:
    """``head: a, b, c`` naming at most ``most`` paths, then how many more."""
    shown = ", ".join(paths[:most])
    more = f" and {len(paths) - most} more" if len(paths) > most else ""
    return f"{head}: {shown}{more}"


def context_notice(walk: Scan) -> str:
    """The one line that names a big context: size, files, the largest directories."""
    root, total_bytes, file_count = walk.root, walk.total_bytes, walk.file_count
    top = largest_dirs(walk.sizes())
    biggest = ", ".join(f"{name} {human_bytes(b)} in {n:,} files" for name, b, n in top)
    example = top[0][0] if top else "data/"
    return (
        f"the context of {root} is {human_bytes(total_bytes)} in {file_count:,} "
        f"files and travels with every job (largest: {biggest or 'none'}); leave out what "
        f"jobs do not need with a line such as {example!r} in {root / KINETICIGNORE} or "
        f"a .gitignore, or pass data as kinetic.Data; `kinetic context {root}` lists it"
    )


def human_bytes(n: int) -> str:
    """``n`` bytes for people, in powers of 1024: ``812 B``, ``3.4 KB``, ``91.2 MB``."""
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def module_to_ship(fn: Callable[..., Any], root: Path) -> ModuleType | None:
    """The module defining ``fn`` if it lives inside ``root`` (ship its code by value)."""
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    filename = getattr(module, "__file__", None)
    if module is None or filename is None or module.__name__ == "__main__":
        return None  # cloudpickle already ships __main__ by value
    try:
        Path(filename).resolve().relative_to(root)
    except ValueError:
        return None
    return module


@contextlib.contextmanager
def shipping_by_value(fn: Callable[..., Any], root: Path) -> Iterator[None]:
    """Hold the pickling lock, with ``fn``'s module registered by value if it is ours."""
    module = module_to_ship(fn, root)
    with PICKLE_LOCK:
        if module is not None:
            cloudpickle.register_pickle_by_value(module)
        try:
            yield
        finally:
            if module is not None:
                cloudpickle.unregister_pickle_by_value(module)


class _Frames:
    """A pickle sink written in Python on purpose: the C pickler hands it one ~64 KiB
    frame at a time, and each call lets the interpreter pass the GIL to other threads
    (the caller's event loop among them). ``cloudpickle.dumps`` of a large argument is
    one C call that would hold the GIL, and so the loop, until it is done."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.parts.append(data)
        return len(data)


def dumps(obj: Any) -> bytes:
    """``cloudpickle.dumps(obj)``, letting other threads run between frames. Blocking."""
    sink = _Frames()
    cloudpickle.Pickler(sink, protocol=cloudpickle.DEFAULT_PROTOCOL).dump(obj)
    return b"".join(sink.parts)


def pickle_payload(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    root: Path,
    volumes: list[Any] | None = None,
) -> bytes:
    """Pickle ``{"fn", "args", "kwargs"}``. Blocking: call in a thread.

    The function's own module, when it lives in the project, is pickled by value so
    the job runs the code this process has loaded.

    :raises SerializationError: naming the function or the argument that cannot be pickled.
    """
    payload: dict[str, Any] = {"fn": fn, "args": tuple(args), "kwargs": dict(kwargs)}
    if volumes:
        payload["volumes"] = volumes
    with shipping_by_value(fn, root):
        try:
            return dumps(payload)
        except Exception as exc:
            raise _explain_pickling_failure(fn, args, kwargs, exc) from exc


def _explain_pickling_failure(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    exc: Exception,
) -> SerializationError:
    candidates = [(f"the function {getattr(fn, '__qualname__', fn)!r}", fn)]
    candidates += list(name_arguments(fn, args, kwargs))
    for what, value in candidates:
        try:
            cloudpickle.dumps(value)
        except Exception as inner:  # noqa: BLE001 - any failure identifies the culprit
            return SerializationError(
                f"{what} cannot be pickled ({type(inner).__name__}: {inner}); "
                "jobs receive their arguments by value"
            )
    return SerializationError(f"the call cannot be pickled: {type(exc).__name__}: {exc}")


def pickle_function(fn: Callable[..., Any], root: Path) -> bytes:
    """Pickle the function alone (a batch's shared payload). Blocking: call in a thread.

    :raises SerializationError: when it cannot be pickled.
    """
    with shipping_by_value(fn, root):
        try:
            return dumps(fn)
        except Exception as exc:
            raise SerializationError(
                f"the function {getattr(fn, '__qualname__', fn)!r} cannot be pickled "
                f"({type(exc).__name__}: {exc})"
            ) from exc


async def apickle_function(fn: Callable[..., Any], root: Path) -> bytes:
    """:func:`pickle_function` in a worker thread."""
    return await anyio.to_thread.run_sync(pickle_function, fn, root)


async def apickle_payload(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    root: Path,
    volumes: list[Any] | None = None,
) -> bytes:
    """:func:`pickle_payload` in a worker thread."""
    return await anyio.to_thread.run_sync(lambda: pickle_payload(fn, args, kwargs, root, volumes))


def relative_sys_path(root: Path, cwd: Path) -> tuple[list[str], str | None]:
    """Entries of ``sys.path`` inside ``root`` (relative), and the cwd relative to it.

    The job rebuilds them against the unpacked context so imports and relative
    file access behave as they did here. Blocking (it resolves every entry), so
    answers are kept per ``sys.path``, cwd and root: they rarely change in a process.
    """
    key = (tuple(sys.path), str(cwd), str(root))
    known = _SYS_PATHS.get(key)
    if known is None:
        known = _relative_sys_path(root, cwd)
        with _ARCHIVES_LOCK:
            _SYS_PATHS[key] = known
            while len(_SYS_PATHS) > 64:  # a process that keeps changing sys.path
                del _SYS_PATHS[next(iter(_SYS_PATHS))]
    entries, rel_cwd = known
    return list(entries), rel_cwd


_SYS_PATHS: dict[tuple[tuple[str, ...], str, str], tuple[tuple[str, ...], str | None]] = {}


def _relative_sys_path(root: Path, cwd: Path) -> tuple[tuple[str, ...], str | None]:
    entries: list[str] = []
    for entry in sys.path:
        p = Path(entry or os.getcwd()).resolve()
        try:
            rel = p.relative_to(root).as_posix()
        except ValueError:
            continue
        rel = "" if rel == "." else rel
        if rel not in entries:
            entries.append(rel)
    try:
        rel_cwd: str | None = cwd.resolve().relative_to(root).as_posix()
    except ValueError:
        rel_cwd = None
    return tuple(entries), None if rel_cwd in (None, ".") else rel_cwd
