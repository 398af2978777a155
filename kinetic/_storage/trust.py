"""Which storage this process reads jobs from: the storage a handle names must be ours.

A handle is plain data, and it names its own storage (``bucket_name``: a GCS bucket, or a
local backend's storage directory). Reading a job's result unpickles what lies there,
and unpickling runs code. So a handle built from a dict (``JobHandle.from_dict``), or
read from a stored record, must not make this process read from storage that someone
else writes. Before any object of a handle's job is read (:func:`check_location`, on
every use of the handle):

- **a local root** (the storage directory's parent) must be this user's, writable by no
  one else, and reached through directories and links only root or this user controls
  (a sticky directory such as ``/tmp`` may be writable by all: no one else can rename
  or remove our entries there). Checked on every use, not only at submission;
- **a bucket** must be one this process's settings name: the configured one (the
  environment and the active profile), or one a submission, ``attach`` or listing of
  this process used (:func:`trust_settings`).

Anything else is refused with :class:`~kinetic._exceptions.UntrustedStorageError`,
unless the caller trusted that storage explicitly (``from_dict(..., trust_storage=True)``,
:func:`trust`). Blocking, but a few ``lstat`` calls only (the settings are read once per
bucket that is not trusted yet).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from kinetic._exceptions import ConfigError, JobNotFoundError, UntrustedStorageError
from runner.fs import check_private_dir

if TYPE_CHECKING:
    from kinetic._core.config import Settings

_TRUSTED: set[tuple[str, str]] = set()  # (kind, location): kind "local" or "bucket"
_MAX_LINKS = 40  # as the kernel's limit on symbolic links in one lookup


def _key(backend: str, location: str) -> tuple[str, str]:
    if backend == "local":
        return ("local", os.path.abspath(location))
    return ("bucket", location)


def trust(backend: str, bucket_name: str) -> None:
    """Trust a handle's storage explicitly, for this process: its jobs' payloads and
    results may be unpickled here whoever can write there."""
    _TRUSTED.add(_key(backend, bucket_name))


def trust_settings(settings: Settings) -> None:
    """Trust the bucket ``settings`` name (the process chose them: its arguments, its
    environment, its profile). A local root is checked on every use instead."""
    if settings.backend != "local" and settings.project:
        _TRUSTED.add(("bucket", settings.bucket_name))


def check_location(backend: str, bucket_name: str, *, job_id: str) -> None:
    """Refuse a handle whose storage this process does not trust (module docstring).

    :raises UntrustedStorageError: naming the storage, why, and the opt-in.
    :raises JobNotFoundError: a local handle whose root does not exist (any more).
    """
    if _key(backend, bucket_name) in _TRUSTED:
        return
    if backend == "local":
        root = Path(bucket_name).parent
        if not os.path.lexists(root):  # nothing to read, nor to trust
            raise JobNotFoundError(f"no job {job_id!r}: its local root {root} does not exist")
        try:
            check_local_root(root)
        except UntrustedStorageError as exc:
            raise UntrustedStorageError(
                f"job {job_id}'s handle names the local storage {bucket_name}, which is not "
                f"safe to read: {exc}. Reading its result would unpickle what is there; "
                "pass trust_storage=True to JobHandle.from_dict only if you trust everyone "
                "who can write there (docs/security.md#handles)"
            ) from None
        return
    configured = _configured_bucket()
    if configured == bucket_name:
        _TRUSTED.add(("bucket", bucket_name))
        return
    raise UntrustedStorageError(
        f"job {job_id}'s handle names the bucket {bucket_name!r}, which is not this "
        f"process's jobs bucket ({configured or 'none configured'}): reading its result "
        "would unpickle what that bucket holds. Attach by id in your own storage "
        "(kinetic.attach), or pass trust_storage=True to JobHandle.from_dict if you trust "
        "everyone who can write there (docs/security.md#handles)"
    )


def _configured_bucket() -> str | None:
    """The jobs bucket of the settings in force (environment, active profile); None
    where they name none (the local backend, or settings that do not load)."""
    from kinetic._settings import load_settings

    try:
        settings = load_settings()
        return settings.bucket_name if settings.project else None
    except ConfigError:
        return None


def check_local_root(root: Path) -> None:
    """Refuse a local root that another user could have written, or could swap.

    The root must exist, belong to this user and be writable by no one else; every
    directory and link on the way to it must belong to root or this user, and a
    directory on the way that others may write must be sticky.

    :raises UntrustedStorageError: naming the path and what is wrong with it.
    """
    uid = os.geteuid()
    try:
        resolved = _walk(os.path.abspath(root), uid, links=0)
        st = os.stat(resolved)
    except FileNotFoundError:
        raise UntrustedStorageError(f"{root} does not exist") from None
    except OSError as exc:
        raise UntrustedStorageError(f"{root} cannot be checked ({exc})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedStorageError(f"{root} is not a directory")
    try:  # the rule every local root follows (runner.fs), on the root itself
        check_private_dir(Path(resolved))
    except PermissionError as exc:
        raise UntrustedStorageError(str(exc)) from None


def _walk(path: str, uid: int, links: int) -> str:
    """``path`` with its links resolved, each step checked (:func:`check_local_root`)."""
    current = "/"
    _check_step(current, os.lstat(current), uid)
    for name in path.split("/"):
        if name in ("", "."):
            continue
        if name == "..":
            current = os.path.dirname(current)
            continue
        step = os.path.join(current, name)
        st = os.lstat(step)
        _check_step(step, st, uid)
        if stat.S_ISLNK(st.st_mode):
            if links >= _MAX_LINKS:
                raise UntrustedStorageError(f"too many symbolic links on the way to {path}")
            target = os.path.join(current, os.readlink(step))
            current = _walk(target, uid, links + 1)
        else:
            current = step
    return current


def _check_step(step: str, st: os.stat_result, uid: int) -> None:
    if st.st_uid not in (0, uid):
        raise UntrustedStorageError(f"{step} belongs to uid {st.st_uid}, another user")
    others_write = not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o022
    if others_write and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        raise UntrustedStorageError(
            f"{step} is writable by other users (mode {st.st_mode & 0o7777:o}), "
            "who could replace what lies below it"
        )
