"""Turn a call into artifacts: the pickled payload and the context archive.

The context archive is the user's project (the *package root*) as a
deterministic zip, so equal trees give equal bytes and one content address:
an unchanged tree is stored once. Zipping and pickling are CPU work and run in
worker threads; cloudpickle's by-value registry is process-global, so every
use of it holds one lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import stat
import sys
import threading
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio.to_thread
import cloudpickle

from kinetic._core.context_rules import ROOT_MARKERS, ExcludeRules
from kinetic._core.functions import name_arguments
from kinetic._exceptions import ConfigError, SerializationError

PICKLE_LOCK = threading.Lock()
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
_MAX_CONTEXT_BYTES = int(os.environ.get("KINETIC_MAX_CONTEXT_MB", "1024")) << 20


@dataclass(frozen=True)
class ContextArchive:
    """A zipped package root and its SHA-256."""

    root: Path
    data: bytes
    sha256: str


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
        return root
    here = start.resolve()
    while (here / "__init__.py").exists() and here.parent != here:
        here = here.parent
    for candidate in (here, *here.parents):
        if any((candidate / marker).exists() for marker in ROOT_MARKERS):
            return candidate
    return here


def _load_rules(root: Path) -> ExcludeRules:
    ignore = root / ".kineticignore"
    if ignore.is_file():
        return ExcludeRules.with_ignore_file(ignore.read_text(encoding="utf-8").splitlines())
    return ExcludeRules()


@dataclass(frozen=True)
class ContextFile:
    relpath: str
    path: Path
    size: int
    mtime_ns: int
    mode: int


def list_context_files(root: Path, *, exclude: tuple[Path, ...] = ()) -> list[ContextFile]:
    """The files that travel with a job, sorted; stat only, no reads. Blocking.

    :param exclude: absolute paths left out besides the rules (e.g. local data
        shipped separately, or Kinetic's own local storage when it sits inside).
    """
    rules = _load_rules(root)
    skip = {p.resolve() for p in exclude}
    found: list[ContextFile] = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        rel_base = base.relative_to(root).as_posix()
        rel_base = "" if rel_base == "." else rel_base + "/"
        dirnames[:] = sorted(
            d
            for d in dirnames
            if not rules.excludes(rel_base + d, is_dir=True)
            and (base / d).resolve() not in skip
            and not (base / d / "pyvenv.cfg").exists()  # any virtualenv, whatever its name
        )
        for name in sorted(filenames):
            path = base / name
            rel = rel_base + name
            if rules.excludes(rel, is_dir=False) or (skip and path.resolve() in skip):
                continue
            try:
                st = path.stat()
            except OSError:
                continue  # vanished, or a dangling link
            if stat.S_ISREG(st.st_mode):
                found.append(ContextFile(rel, path, st.st_size, st.st_mtime_ns, st.st_mode))
    return found


def fingerprint(files: list[ContextFile]) -> str:
    """A digest of the listing's metadata: equal while no file changed."""
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.relpath}\0{f.size}\0{f.mtime_ns}\0{f.mode}\n".encode())
    return h.hexdigest()


def build_context_archive(root: Path, files: list[ContextFile]) -> ContextArchive:
    """Zip ``files`` deterministically (sorted, fixed timestamps). Blocking: call in a thread.

    :raises ConfigError: when the archive would exceed ``KINETIC_MAX_CONTEXT_MB``.
    """
    total = sum(f.size for f in files)
    if total > _MAX_CONTEXT_BYTES:
        raise ConfigError(
            f"the project at {root} is larger than {_MAX_CONTEXT_BYTES >> 20} MB; "
            "exclude files with .kineticignore, pass big inputs as kinetic.Data, "
            "or set KINETIC_PACKAGE_ROOT"
        )
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for f in files:
            try:
                data = f.path.read_bytes()
            except OSError:
                continue  # removed since it was listed
            info = zipfile.ZipInfo(f.relpath, date_time=_ZIP_EPOCH)
            info.external_attr = (f.mode & 0o777) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data, compresslevel=1)
    data = buf.getvalue()
    return ContextArchive(root=root, data=data, sha256=hashlib.sha256(data).hexdigest())


_ARCHIVES: dict[tuple[Path, str], ContextArchive] = {}
_ARCHIVES_LOCK = threading.Lock()


def context_archive(root: Path, *, exclude: tuple[Path, ...] = ()) -> ContextArchive:
    """The archive of ``root``, rebuilt only when a file's metadata changed. Blocking."""
    files = list_context_files(root, exclude=exclude)
    key = (root, fingerprint(files))
    with _ARCHIVES_LOCK:
        cached = _ARCHIVES.get(key)
    if cached is not None:
        return cached
    archive = build_context_archive(root, files)
    with _ARCHIVES_LOCK:
        # Keep one archive per root: older states of the tree are not coming back.
        for old in [k for k in _ARCHIVES if k[0] == root]:
            del _ARCHIVES[old]
        _ARCHIVES[key] = archive
    return archive


async def acontext_archive(root: Path, *, exclude: tuple[Path, ...] = ()) -> ContextArchive:
    """:func:`context_archive` in a worker thread."""
    return await anyio.to_thread.run_sync(lambda: context_archive(root, exclude=exclude))


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
            return bytes(cloudpickle.dumps(payload))
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
            return bytes(cloudpickle.dumps(fn))
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
    file access behave as they did here.
    """
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
    return entries, None if rel_cwd in (None, ".") else rel_cwd
