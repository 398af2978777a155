"""Turn ``kinetic.Data`` arguments and volumes into references a job can resolve.

Local data is hashed (in worker threads, with the persistent stat cache) and
uploaded once to the content-addressed cache: files go to
``default/data-cache/{hash}/…`` concurrently and streamed, and the marker
``default/data-markers/{hash}`` — listing the files — is written last. A
marker is the only proof of a complete upload: without one, the upload is
done again rather than trusted. ``gs://`` data is referenced (and downloaded
by the job, or mounted with GCS FUSE on GKE); ``hf://`` data is loaded by the job.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from kinetic._concurrency import for_each
from kinetic._data.data import Data
from kinetic._exceptions import DataError, StorageError
from kinetic._storage.base import Storage
from runner import protocol
from runner.data import FUSE_ROOT, DataRef, cache_key, marker_key
from runner.walk import replace_leaves

UPLOAD_CONCURRENCY = 16

RESERVED_MOUNTS = frozenset(
    {"/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/root", "/run",
     "/sbin", "/sys", "/tmp", "/usr", "/var", FUSE_ROOT}
)  # fmt: skip
_RESERVED_TREES = ("/proc/", "/sys/", "/dev/", f"{FUSE_ROOT}/")


def check_mount_path(mount: object) -> str:
    """Return a valid volume mount path.

    :raises DataError: when it is not absolute, or is a system or Kinetic path.
    """
    if not isinstance(mount, str) or not mount.startswith("/"):
        raise DataError(f"volume mount path must be absolute (start with '/'), got {mount!r}")
    normal = os.path.normpath(mount)
    if normal in RESERVED_MOUNTS or normal.startswith(_RESERVED_TREES):
        raise DataError(f"volume mount path {mount!r} is reserved; mount data elsewhere")
    return normal


_local_volumes_refused: str | None = None
_local_volumes_probed = False


async def check_local_volumes() -> None:
    """Refuse volumes on the local backend where this machine cannot give a job a
    private mount namespace (:mod:`runner.mounts`): asked once per process, in a child
    interpreter, so the refusal comes before anything of the job is written.

    :raises DataError: saying why, and what to do instead.
    """
    global _local_volumes_refused, _local_volumes_probed
    if not _local_volumes_probed:
        done = await anyio.run_process(
            [sys.executable, "-m", "runner.mounts"], check=False, stdin=subprocess.DEVNULL
        )
        if done.returncode:
            reason = done.stderr.decode(errors="replace").strip().splitlines()
            _local_volumes_refused = reason[-1] if reason else f"exit status {done.returncode}"
        _local_volumes_probed = True
    if _local_volumes_refused is not None:
        raise DataError(
            "volumes on the local backend need a private mount namespace (so that a job "
            "never creates its mount paths on this machine), and this machine refuses one "
            f"({_local_volumes_refused}); unprivileged user namespaces may be disabled or "
            "restricted. Pass the data as an argument (kinetic.Data) instead, or run on GKE"
        )


@dataclass
class PreparedData:
    """The call's arguments with references in place of ``Data``, and what that needs."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    volumes: list[tuple[str, DataRef]] = field(default_factory=list)
    local_paths: list[Path] = field(default_factory=list)
    """Local data paths: left out of the context archive, they travel through the cache."""
    fuse_buckets: set[str] = field(default_factory=set)
    has_data: bool = False
    """Some argument or volume is a reference the job must resolve."""


def holds_data(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """Whether a ``kinetic.Data`` sits anywhere in the arguments. Blocking: it walks them
    all (large arguments take a while), so call it in a worker thread.

    :raises DataError: for a ``Data`` in a set or used as a dict key.
    """
    return bool(_find_data(args, kwargs))


def _find_data(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[Data]:
    found: list[Data] = []

    def collect(d: Any) -> Any:
        found.append(d)
        return d

    try:
        replace_leaves((args, dict(kwargs)), _is_data, collect)
    except TypeError as exc:
        raise DataError(str(exc)) from exc
    return found


def _replaced(
    args: tuple[Any, ...], kwargs: Mapping[str, Any], refs: dict[Data, DataRef]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    new_args, new_kwargs = replace_leaves((args, dict(kwargs)), _is_data, refs.__getitem__)
    return tuple(new_args), dict(new_kwargs)


async def prepare_data(
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    volumes: Mapping[str, Any] | None,
    *,
    storage: Storage,
    local_backend: bool,
) -> PreparedData:
    """Find every ``Data`` (at any depth, and in ``volumes``), upload local ones to the
    cache, and return the arguments with :class:`DataRef` in their place.

    The arguments are walked in worker threads: they may be large.

    :raises DataError: for a ``Data`` in a set or used as a dict key, or a bad volume.
    """
    found = await anyio.to_thread.run_sync(_find_data, args, kwargs)
    mounts = [(check_mount_path(m), d) for m, d in (volumes or {}).items()]
    if mounts and local_backend:
        await check_local_volumes()
    for mount, d in mounts:
        if not isinstance(d, Data):
            raise DataError(f"volume {mount!r} must be a kinetic.Data, got {type(d).__name__}")
        found.append(d)
    if not found:
        return PreparedData(tuple(args), dict(kwargs))

    prepared = PreparedData(tuple(args), dict(kwargs), has_data=True)
    refs = await _references(dict.fromkeys(found), storage, local_backend, prepared)
    prepared.args, prepared.kwargs = await anyio.to_thread.run_sync(_replaced, args, kwargs, refs)
    prepared.volumes = [(mount, refs[d]) for mount, d in mounts]
    return prepared


@dataclass
class PreparedCalls:
    """A batch's calls with references in place of ``Data``."""

    calls: list[tuple[tuple[Any, ...], dict[str, Any]]]
    local_paths: list[Path] = field(default_factory=list)
    has_data: bool = False
    fuse_buckets: set[str] = field(default_factory=set)


async def prepare_calls_data(
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]],
    *,
    storage: Storage,
    local_backend: bool,
) -> PreparedCalls:
    """:func:`prepare_data` for every input of a batch; each distinct ``Data`` is
    hashed and uploaded once, however many inputs share it.

    :raises DataError: naming the input whose ``Data`` is in a set or used as a key.
    """
    found = await anyio.to_thread.run_sync(_find_in_calls, calls)
    if not found:
        return PreparedCalls(calls)
    holder = PreparedData((), {}, has_data=True)
    refs = await _references(found, storage, local_backend, holder)

    def _replace_all() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        return [replace_leaves(call, _is_data, refs.__getitem__) for call in calls]

    new_calls = await anyio.to_thread.run_sync(_replace_all)
    return PreparedCalls(
        new_calls, holder.local_paths, has_data=True, fuse_buckets=holder.fuse_buckets
    )


def _find_in_calls(calls: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> dict[Data, None]:
    """Every distinct ``Data`` in a batch's calls. Blocking (walks every input).

    :raises DataError: naming the input whose ``Data`` is in a set or used as a key.
    """
    found: dict[Data, None] = {}

    def collect(d: Any) -> Any:
        found[d] = None
        return d

    for index, call in enumerate(calls):
        try:
            replace_leaves(call, _is_data, collect)
        except TypeError as exc:
            raise DataError(f"input {index}: {exc}") from exc
    return found


def _is_data(x: object) -> bool:
    return isinstance(x, Data)


async def _references(
    found: dict[Data, None], storage: Storage, local_backend: bool, prepared: PreparedData
) -> dict[Data, DataRef]:
    """A reference for each distinct ``Data``, hashing and uploading a few at a time."""
    refs: dict[Data, DataRef] = {}

    async def make(d: Data) -> None:
        refs[d] = await _reference(d, storage, local_backend, prepared)

    await for_each(list(found), make, limit=4)
    return refs


async def _reference(
    d: Data, storage: Storage, local_backend: bool, prepared: PreparedData
) -> DataRef:
    if d.is_hf:
        hf = d.hf
        assert hf is not None
        options = {
            "repo_id": hf.repo_id,
            "split": hf.split,
            "config_name": hf.config_name,
            "revision": hf.revision,
            "trust_remote_code": d.hf_trust_remote_code,
        }
        return DataRef("hf", uri=d.path, hf=tuple(options.items()))
    if d.is_gcs:
        gcs = d.gcs
        assert gcs is not None
        if d.fuse and not local_backend:
            prepared.fuse_buckets.add(gcs.bucket)
            where = f"{FUSE_ROOT}/{gcs.bucket}/{gcs.name}".rstrip("/")
            return DataRef("fuse", uri=d.path, local_path=where, is_dir=gcs.is_dir)
        return DataRef("gcs", uri=d.path, is_dir=gcs.is_dir)
    path = Path(d.path)
    prepared.local_paths.append(path)
    if d.fuse and local_backend:
        return DataRef("fuse", local_path=str(path), is_dir=d.is_dir)  # used in place
    digest = await d.acontent_hash()
    await upload_to_cache(storage, path, digest)
    return DataRef("cache", digest=digest, is_dir=d.is_dir, name=path.name)


def _list_tree(path: Path) -> tuple[list[tuple[str, Path]], list[str]]:
    """(relpath, file) pairs to upload, in the hashing rules' order (symlinked dirs skipped),
    and every directory's relpath (so empty ones exist in the job too).

    A single file is listed under its own name.
    """
    if not path.is_dir():
        return [(path.name, path)], []
    files: list[tuple[str, Path]] = []
    dirs: list[str] = []
    for dirpath, dirnames, filenames in os.walk(path):
        base = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not (base / d).is_symlink())
        dirs.extend((base / d).relative_to(path).as_posix() for d in dirnames)
        for name in sorted(filenames):
            files.append(((base / name).relative_to(path).as_posix(), base / name))
    return files, dirs


async def upload_to_cache(storage: Storage, path: Path, digest: str) -> bool:
    """Upload ``path`` under its digest unless its marker exists; return whether it uploaded.

    Files are streamed, ``UPLOAD_CONCURRENCY`` at a time; the marker goes last.
    """
    if await storage.exists(marker_key(digest)):
        return False
    files, dirs = await anyio.to_thread.run_sync(_list_tree, path)

    async def put(file: tuple[str, Path]) -> None:
        rel, source = file
        try:
            await storage.upload_file(cache_key(digest, rel), source)
        except StorageError as exc:
            if await anyio.to_thread.run_sync(os.path.exists, source):
                raise
            raise DataError(
                f"Data path {str(path)!r} changed while it was uploaded: {str(source)!r} is gone"
            ) from exc

    await for_each(files, put, limit=UPLOAD_CONCURRENCY)
    marker = {"files": [rel for rel, _ in files], "dirs": dirs, "name": path.name}
    await storage.write(marker_key(digest), protocol.dump_json(marker))
    return True
