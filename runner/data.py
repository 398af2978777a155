"""Data references inside a job: what a ``kinetic.Data`` becomes on the way, and back.

The submitter replaces each ``kinetic.Data`` argument by a :class:`DataRef`
(plain, picklable, no Kinetic import needed), and the runner's ``resolve``
phase replaces each reference by a local path:

- ``cache``: local data uploaded to the content-addressed cache
  (``default/data-cache/{hash}/…``; the marker ``default/data-markers/{hash}``,
  written last, lists the files) is downloaded into the job's data directory;
- ``gcs``: a ``gs://`` object or prefix is downloaded (a missing object is a
  clear error naming the URI);
- ``fuse``: the path where the pod mounts the bucket read-only (GKE), or, on the
  local backend, the original local path, used in place;
- ``hf``: a Hugging Face dataset is loaded with ``datasets`` and handed over as
  a directory written by ``save_to_disk`` (read it with ``load_from_disk``).

Volumes are the same references placed at absolute mount paths.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner import protocol
from runner.store import RunnerStore, open_store
from runner.walk import replace_leaves

FUSE_ROOT = protocol.FUSE_ROOT


def cache_key(digest: str, relpath: str) -> str:
    return f"default/data-cache/{digest}/{relpath}"


def marker_key(digest: str) -> str:
    return f"default/data-markers/{digest}"


@dataclass(frozen=True)
class DataRef:
    """A ``kinetic.Data`` as it travels inside a job payload."""

    kind: str  # "cache" | "gcs" | "fuse" | "hf"
    digest: str = ""
    uri: str = ""
    local_path: str = ""
    is_dir: bool = True
    name: str = ""
    hf: tuple[tuple[str, Any], ...] = ()
    """``load_dataset`` options as (name, value) pairs (a tuple, so refs stay hashable)."""


class DataResolutionError(Exception):
    """A reference could not be turned into a path (the message names the data)."""


def resolve_arguments(
    store: RunnerStore,
    args: Any,
    kwargs: dict[str, Any],
    workdir: Path,
    volumes: list[tuple[str, DataRef]] | None = None,
    *,
    private_volumes: bool = False,
) -> tuple[Any, dict[str, Any]]:
    """Replace every :class:`DataRef` in ``args``/``kwargs`` by a local path, and
    materialize ``volumes`` at their mount paths: in a private mount namespace of this
    process when ``private_volumes`` (a local job, which shares the user's filesystem;
    see :mod:`runner.mounts`), as symbolic links otherwise (a pod's own filesystem).

    :raises DataResolutionError: naming the data that could not be made available.
    """
    resolver = _Resolver(store, workdir / "data")
    if private_volumes and volumes:
        import tempfile

        from runner.mounts import MountError, place_volumes

        sources = [(mount, resolver.path(ref)) for mount, ref in volumes]
        try:
            place_volumes(sources, Path(tempfile.mkdtemp(prefix="kinetic-mounts-")))
        except MountError as exc:
            raise DataResolutionError(str(exc)) from exc
    else:
        for mount, ref in volumes or ():
            resolver.mount(mount, ref)
    is_ref = lambda x: isinstance(x, DataRef)
    new_args = replace_leaves(args, is_ref, resolver.path)
    new_kwargs = replace_leaves(kwargs, is_ref, resolver.path)
    return new_args, new_kwargs


class _Resolver:
    def __init__(self, store: RunnerStore, data_dir: Path) -> None:
        self.store = store
        self.data_dir = data_dir
        self.done: dict[DataRef, str] = {}

    def path(self, ref: DataRef) -> str:
        if ref not in self.done:
            self.done[ref] = self._materialize(ref)
        return self.done[ref]

    def mount(self, mount: str, ref: DataRef) -> None:
        source = self.path(ref)
        target = Path(mount)
        if target.exists() or target.is_symlink():
            if target.is_symlink() and os.readlink(target) == source:
                return
            raise DataResolutionError(f"volume mount path {mount} already exists")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(source, target_is_directory=ref.is_dir)

    def _materialize(self, ref: DataRef) -> str:
        if ref.kind == "fuse":
            return ref.local_path
        if ref.kind == "cache":
            return self._from_cache(ref)
        if ref.kind == "gcs":
            return self._from_gcs(ref)
        if ref.kind == "hf":
            return self._from_hf(ref)
        raise DataResolutionError(f"unknown data reference kind {ref.kind!r}")

    def _from_cache(self, ref: DataRef) -> str:
        try:
            marker = protocol.load_json(self.store.read(marker_key(ref.digest)))
        except OSError as exc:
            raise DataResolutionError(f"data {ref.digest[:12]} is missing from the cache") from exc
        target = self.data_dir / ref.digest
        target.mkdir(parents=True, exist_ok=True)
        for rel in marker.get("dirs", []):
            (target / rel).mkdir(parents=True, exist_ok=True)
        for rel in marker["files"]:
            self.store.download(cache_key(ref.digest, rel), target / rel)
        return str(target if ref.is_dir else target / ref.name)

    def _from_gcs(self, ref: DataRef) -> str:
        bucket, _, name = ref.uri.removeprefix("gs://").partition("/")
        source = open_store(f"gs://{bucket}")
        target = self.data_dir / "gcs" / bucket / name.rstrip("/")
        try:
            if ref.is_dir:
                prefix = name.rstrip("/") + "/" if name.rstrip("/") else ""
                keys = source.list(prefix)
                for key in keys:
                    if not key.endswith("/"):
                        source.download(key, target / key[len(prefix) :])
                target.mkdir(parents=True, exist_ok=True)
            else:
                source.download(name, target)
        except FileNotFoundError as exc:
            raise DataResolutionError(f"{ref.uri} does not exist") from exc
        except OSError as exc:
            raise DataResolutionError(f"cannot download {ref.uri}: {exc}") from exc
        finally:
            source.close()
        return str(target)

    def _from_hf(self, ref: DataRef) -> str:
        try:
            import datasets
        except ImportError as exc:
            raise DataResolutionError(
                f"{ref.uri} needs the `datasets` package in the job's environment"
            ) from exc
        hf = dict(ref.hf)
        target = self.data_dir / "hf" / str(hf.get("repo_id") or "dataset").replace("/", "--")
        try:
            options: dict[str, Any] = {
                "name": hf.get("config_name"),
                "split": hf.get("split"),
                "revision": hf.get("revision"),
            }
            if hf.get("trust_remote_code"):
                options["trust_remote_code"] = True
            loaded = datasets.load_dataset(hf["repo_id"], **options)
        except Exception as exc:
            raise DataResolutionError(f"cannot load {ref.uri}: {exc}") from exc
        loaded.save_to_disk(str(target))
        return str(target)
