"""``Data``: a declared data dependency of a job (local path, GCS URI or Hugging Face dataset).

A ``Data`` is a small immutable value. It is validated once, where the user builds it;
after that it travels inside job payloads (pickled with cloudpickle) and is resolved to a
plain filesystem path on the remote side, so unpickling never touches the filesystem.

Kinds of path (the same as keras-kinetic 0.0.4, with stricter validation):

- a local file or directory, absolute or relative to the cwd, ``~`` expanded; it must
  exist when the ``Data`` is built;
- ``gs://bucket/prefix/`` (a directory: the trailing slash says so) or
  ``gs://bucket/object`` (a single object); ``gs://bucket`` means the whole bucket;
- ``hf://namespace/name?split=...&config_name=...&revision=...`` (a Hugging Face dataset,
  always a directory on the remote side; ``fuse=True`` is refused).
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import urllib.parse
from dataclasses import dataclass

from kinetic._data.hashing import ahash_path, hash_path
from kinetic._exceptions import DataError

__all__ = ["Data", "GcsSource", "HfSource"]

logger = logging.getLogger(__name__)

_GCS = "gs://"
_HF = "hf://"
# https://cloud.google.com/storage/docs/buckets#naming (dotted names may reach 222 chars).
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")
# The shape huggingface_hub accepts for a repo id: an optional namespace, a name of up to
# 96 characters, both from [A-Za-z0-9_.-].
_HF_REPO_RE = re.compile(r"(?:[\w.-]+/)?[\w.-]{1,96}", re.ASCII)
_HF_QUERY_KEYS = ("split", "config_name", "revision")


@dataclass(frozen=True, slots=True)
class GcsSource:
    """A parsed ``gs://`` URI.

    :ivar bucket: the bucket name.
    :ivar name: the object name, or the prefix of a directory without leading and
        trailing slashes (``""`` for a whole bucket).
    :ivar is_dir: whether the URI names a prefix (it ends with ``/``) rather than an object.
    """

    bucket: str
    name: str
    is_dir: bool


@dataclass(frozen=True, slots=True)
class HfSource:
    """A parsed ``hf://`` URI: the arguments of ``datasets.load_dataset`` on the remote side.

    :ivar repo_id: ``name`` or ``namespace/name``.
    :ivar split: the ``split`` query parameter, if given.
    :ivar config_name: the ``config_name`` query parameter (``name=`` of ``load_dataset``).
    :ivar revision: the ``revision`` query parameter (branch, tag or commit).
    """

    repo_id: str
    split: str | None = None
    config_name: str | None = None
    revision: str | None = None


class Data:
    """A reference to data that must be available to the job, seen by it as a plain path.

    Pass it as an argument of a decorated function (or in ``volumes``): on the remote side
    the function receives a filesystem path where the data was downloaded, or mounted
    with GCS FUSE when ``fuse=True`` (read on demand; useful for large datasets of which
    the job reads a part).

    Examples::

        Data("./my_dataset/")                        # local directory
        Data("./config.json")                        # local file
        Data("gs://my-bucket/datasets/imagenet/")    # GCS directory: trailing slash
        Data("gs://my-bucket/weights.h5")            # GCS object
        Data("gs://my-bucket/imagenet/", fuse=True)  # mounted lazily
        Data("hf://imdb?split=train")                # Hugging Face dataset
        Data("hf://org/repo", hf_trust_remote_code=True)

    :param path: a local path (``str`` or path-like), ``gs://...`` or ``hf://...``.
    :param fuse: mount the data with GCS FUSE instead of downloading it.
    :param hf_trust_remote_code: let ``datasets`` run the dataset repository's code
        (only meaningful for ``hf://``).
    :raises DataError: if the path is empty, a local path does not exist, a URI is
        malformed, or ``fuse=True`` is combined with ``hf://``.
    """

    __slots__ = ("_fuse", "_gcs", "_hf", "_hf_trust_remote_code", "_path")

    _path: str
    _fuse: bool
    _hf_trust_remote_code: bool
    _gcs: GcsSource | None
    _hf: HfSource | None

    def __init__(
        self,
        path: str | os.PathLike[str],
        fuse: bool = False,
        hf_trust_remote_code: bool = False,
    ) -> None:
        if not isinstance(path, str | os.PathLike):
            raise DataError(f"Data path must be a str or a path, got {type(path).__name__}")
        raw = os.fspath(path)
        if not isinstance(raw, str):
            raise DataError("Data path must be text, not bytes")
        if not raw:
            raise DataError("Data path must not be empty")
        for flag, value in (("fuse", fuse), ("hf_trust_remote_code", hf_trust_remote_code)):
            if not isinstance(value, bool):
                raise DataError(f"Data {flag} must be True or False, got {value!r}")
        gcs: GcsSource | None = None
        hf: HfSource | None = None
        if raw.startswith(_GCS):
            gcs = _parse_gcs(raw)
            # A bare bucket is a directory: give it the slash that says so downstream.
            resolved = raw if gcs.name or raw.endswith("/") else raw + "/"
        elif raw.startswith(_HF):
            if fuse:
                raise DataError(
                    "fuse=True is not supported for Hugging Face datasets (hf:// URIs): "
                    "they are downloaded with the datasets library"
                )
            hf = _parse_hf(raw)
            resolved = raw
        else:
            resolved = os.path.abspath(os.path.expanduser(raw))
            if not os.path.exists(resolved):
                raise DataError(f"Data path does not exist: {raw} (resolved to {resolved})")
        self._path = resolved
        self._fuse = fuse
        self._hf_trust_remote_code = hf_trust_remote_code
        self._gcs = gcs
        self._hf = hf

    # -- what it is -----------------------------------------------------------------------

    @property
    def path(self) -> str:
        """The absolute local path, or the URI as given (``gs://bucket`` gains a ``/``)."""
        return self._path

    @property
    def fuse(self) -> bool:
        """Whether the data is mounted with GCS FUSE rather than downloaded."""
        return self._fuse

    @property
    def hf_trust_remote_code(self) -> bool:
        """Whether ``datasets`` may run code from the dataset repository."""
        return self._hf_trust_remote_code

    @property
    def is_gcs(self) -> bool:
        """Whether the path is a ``gs://`` URI."""
        return self._gcs is not None

    @property
    def is_hf(self) -> bool:
        """Whether the path is an ``hf://`` URI."""
        return self._hf is not None

    @property
    def is_dir(self) -> bool:
        """Whether the data is a directory.

        Local paths are checked on each call (as the original did); a GCS URI is a
        directory when it ends with ``/``; a Hugging Face dataset is always a directory.
        """
        if self._gcs is not None:
            return self._gcs.is_dir
        if self._hf is not None:
            return True
        return os.path.isdir(self._path)

    @property
    def gcs(self) -> GcsSource | None:
        """The parsed ``gs://`` URI, or ``None`` for other kinds."""
        return self._gcs

    @property
    def hf(self) -> HfSource | None:
        """The parsed ``hf://`` URI, or ``None`` for other kinds."""
        return self._hf

    # -- content hash ---------------------------------------------------------------------

    def content_hash(self) -> str:
        """Return the SHA-256 content hash of a local file or directory (hex).

        Equal to keras-kinetic 0.0.4's for the same tree: per file SHA-256(relpath + NUL +
        bytes), combined in sorted walk order under a ``file:``/``dir:`` prefix; symlinked
        files count with their target's bytes, symlinked directories are skipped. Files
        are read in parallel threads; files unchanged since a previous hash (same size,
        mtime, ctime, inode) are not read again (persistent stat cache, see
        :mod:`kinetic._data.hashing`). Blocks the calling thread.

        :raises DataError: for ``gs://`` and ``hf://`` data (their content is remote), if
            the path vanished or cannot be read, contains a dangling symlink or a special
            file, or a file kept changing while it was read.
        """
        return hash_path(self._local_path())

    async def acontent_hash(self) -> str:
        """Async twin of :meth:`content_hash`; the work runs in worker threads.

        No timeout of its own (the cost is bounded by the tree). Cancellation is honoured
        between directories and jobs of files, and returns after the threads stopped.

        :raises DataError: as :meth:`content_hash`.
        """
        return await ahash_path(self._local_path())

    def _local_path(self) -> str:
        if self._gcs is not None or self._hf is not None:
            raise DataError(f"Cannot compute content hash for cloud URI: {self._path}")
        return self._path

    # -- value semantics ------------------------------------------------------------------

    def _identity(self) -> tuple[str, bool, bool]:
        return (self._path, self._fuse, self._hf_trust_remote_code)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Data):
            return NotImplemented
        return self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def __repr__(self) -> str:
        args = [repr(self._path)]
        if self._fuse:
            args.append("fuse=True")
        if self._hf_trust_remote_code:
            args.append("hf_trust_remote_code=True")
        return f"Data({', '.join(args)})"

    def __setattr__(self, name: str, value: object) -> None:
        # Immutable once built, since it is hashable: __init__ sets each slot once.
        if hasattr(self, name):
            raise AttributeError(f"Data is immutable: cannot set {name!r}")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Data is immutable: cannot delete {name!r}")

    def __reduce__(self) -> tuple[object, ...]:
        # Rebuild without validation: the remote side has neither the local path nor a
        # reason to re-parse URIs already checked where the Data was made.
        state = (self._path, self._fuse, self._hf_trust_remote_code, self._gcs, self._hf)
        return (_restore, state)


def _restore(
    path: str,
    fuse: bool,
    hf_trust_remote_code: bool,
    gcs: GcsSource | None,
    hf: HfSource | None,
) -> Data:
    data = Data.__new__(Data)
    for name, value in (
        ("_path", path),
        ("_fuse", fuse),
        ("_hf_trust_remote_code", hf_trust_remote_code),
        ("_gcs", gcs),
        ("_hf", hf),
    ):
        object.__setattr__(data, name, value)
    return data


def _parse_gcs(uri: str) -> GcsSource:
    bucket, _, name = uri[len(_GCS) :].partition("/")
    if not _BUCKET_RE.fullmatch(bucket) or ".." in bucket:
        raise DataError(f"invalid GCS bucket name {bucket!r} in {uri!r}")
    if "\n" in name or "\r" in name:
        raise DataError(f"GCS object names cannot contain line breaks: {uri!r}")
    if len(name.encode("utf-8", "surrogatepass")) > 1024:
        raise DataError(f"GCS object name longer than 1024 bytes: {uri!r}")
    is_dir = not name or name.endswith("/")
    if not is_dir:
        _warn_if_looks_like_dir(uri, name)
    return GcsSource(bucket, name.strip("/"), is_dir)


def _warn_if_looks_like_dir(uri: str, name: str) -> None:
    # The original's hint: `gs://b/dataset` is downloaded as one object; a prefix needs `/`.
    last = posixpath.basename(name)
    if last and "." not in last:
        logger.warning(
            "GCS path %r does not end with '/' but its last segment (%r) has no file "
            "extension. If this is a directory (prefix), add a trailing slash: %r",
            uri,
            last,
            uri + "/",
        )


def _parse_hf(uri: str) -> HfSource:
    parts = urllib.parse.urlsplit(uri)
    if parts.fragment:
        raise DataError(f"hf:// URIs take no #fragment: {uri!r}")
    # Same split as the original runner: host and path together form the repo id.
    repo_id = (parts.netloc + parts.path).strip("/")
    if (
        not _HF_REPO_RE.fullmatch(repo_id)
        or "--" in repo_id
        or ".." in repo_id
        or repo_id.endswith(".git")
    ):
        raise DataError(
            f"invalid Hugging Face dataset id {repo_id!r} in {uri!r}: expected "
            "'name' or 'namespace/name' of letters, digits, '-', '_' and '.'"
        )
    try:
        pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True, strict_parsing=True)
    except ValueError as exc:
        raise DataError(f"malformed query in {uri!r}: {exc}") from None
    query: dict[str, str] = {}
    for key, value in pairs:
        if key not in _HF_QUERY_KEYS:
            raise DataError(
                f"unknown parameter {key!r} in {uri!r}; valid: {', '.join(_HF_QUERY_KEYS)}"
            )
        if key in query:
            raise DataError(f"parameter {key!r} given twice in {uri!r}")
        if not value:
            raise DataError(f"parameter {key!r} is empty in {uri!r}")
        query[key] = value
    return HfSource(
        repo_id,
        split=query.get("split"),
        config_name=query.get("config_name"),
        revision=query.get("revision"),
    )
