"""A local job's secrets: references resolved on this machine, in the job's own process.

A spec names secrets (:class:`~runner.protocol.SecretRecord`), never their values. A
pod gets them from Kubernetes; a local job resolves them here, in phase ``secrets``,
just before its function is unpickled, from:

1. the secret's file, ``{secrets dir}/{name}.json`` (``~/.kinetic/secrets``, or
   ``KINETIC_SECRETS_DIR``): a JSON object of key -> value. The file must be a regular
   file of this user that no one else may read or write (``0600``), in a folder of
   this user that no one else may write: a secret others could read is not one, and
   one others could replace would hand the job their value;
2. else, for a key mapped to a variable, that variable in the job's environment (a
   local job starts with its submitter's).

The submitting process runs the same resolution before anything of the job is
written, and drops the values: a missing secret fails the submission, not the job.
Values go into the job's environment only: never into storage, a record or a log (an
error names the secret, its key and its file, never a value). Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from runner.protocol import SecretRecord

DIR_ENV = "KINETIC_SECRETS_DIR"
"""Overrides where local secrets' files are (default ``~/.kinetic/secrets``)."""
MOUNTS_ENV = "KINETIC_SECRET_MOUNTS"
"""In a pod: the Secrets mounted as files (JSON: ``namespace``, and ``secrets``, a list
of references with ``mount``), checked by :func:`check_mounted`."""

_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class SecretError(Exception):
    """A secret could not be resolved (the message names it and says what to do)."""


def secrets_dir(environ: Mapping[str, str]) -> Path:
    """Where this user's local secrets' files are."""
    configured = environ.get(DIR_ENV)
    return Path(configured) if configured else Path.home() / ".kinetic" / "secrets"


def secret_file(name: str, environ: Mapping[str, str]) -> Path:
    """The file that holds local secret ``name``."""
    return secrets_dir(environ) / f"{name}.json"


@dataclass
class Resolved:
    """A job's secret variables: every key of whole secrets (below the captured
    variables, as Kubernetes' ``envFrom`` is below ``env``), and mapped keys (above)."""

    whole: dict[str, str] = field(default_factory=dict)
    mapped: dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:  # never the values
        return f"Resolved(whole={sorted(self.whole)}, mapped={sorted(self.mapped)})"


def resolve(records: Sequence[SecretRecord], environ: Mapping[str, str]) -> Resolved:
    """The variables ``records`` give a job whose environment is ``environ``.

    :raises SecretError: a secret that has neither a usable file nor (for mapped keys)
        its variables; a file that others may read or write; a mount (local jobs get
        secrets as variables only).
    """
    out = Resolved()
    for record in records:
        name = record["name"]
        if "mount" in record:
            raise SecretError(
                f"secret {name!r}: a local job cannot mount secrets as files "
                f"(mount={record['mount']!r}); map its keys to variables instead"
            )
        path = secret_file(name, environ)
        data = read_secret_file(path)
        keys = record.get("keys")
        if keys is None:
            if data is None:
                raise SecretError(
                    f"secret {name!r} is not on this machine: write its keys and values "
                    f"as a JSON object to {path} (mode 0600)"
                )
            out.whole.update((k, v) for k, v in data.items() if _VARIABLE.match(k))
            continue
        for key, variable in keys.items():
            if data is not None:
                if key not in data:
                    raise SecretError(f"secret {name!r} has no key {key!r} in {path}")
                out.mapped[variable] = data[key]
            elif variable in environ:
                out.mapped[variable] = environ[variable]
            else:
                raise SecretError(
                    f"secret {name!r} is not on this machine: set {variable} in the "
                    f"submitting environment, or write {path} (mode 0600) holding "
                    f"{{{key!r}: ...}}"
                )
    return out


def read_secret_file(path: Path) -> dict[str, str] | None:
    """The JSON object in the secret file ``path``; None when there is none.

    :raises SecretError: the file or its folder is another user's, others may read or
        write the file, or write the folder; it is not a regular file, or not a JSON
        object of strings. The message says how to fix it, never what the file holds.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SecretError(f"cannot open the secret file {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        _check_file(path, st)
        _check_folder(path.parent)
        with os.fdopen(fd, "rb", closefd=False) as f:
            text = f.read()
    finally:
        os.close(fd)
    try:
        data = json.loads(text)
    except ValueError:
        raise SecretError(f"the secret file {path} is not JSON") from None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise SecretError(
            f"the secret file {path} must hold a JSON object of string keys and string values"
        )
    return data


def _check_file(path: Path, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise SecretError(f"the secret file {path} is not a regular file")
    if st.st_uid != os.geteuid():
        raise SecretError(
            f"the secret file {path} belongs to uid {st.st_uid}, not to you "
            f"(uid {os.geteuid()}): a value someone else wrote is not yours to trust. "
            "Write your own copy"
        )
    if st.st_mode & 0o077:
        raise SecretError(
            f"the secret file {path} is mode {stat.S_IMODE(st.st_mode):04o}: other users "
            f"may read or change it. Run `chmod 600 {path}`"
        )


def _check_folder(folder: Path) -> None:
    st = os.stat(folder)
    if st.st_uid != os.geteuid():
        raise SecretError(
            f"the secrets folder {folder} belongs to uid {st.st_uid}, not to you: "
            "its owner could replace your secrets. Use a folder of your own"
        )
    if st.st_mode & 0o022:
        raise SecretError(
            f"the secrets folder {folder} is mode {stat.S_IMODE(st.st_mode):04o}: other "
            f"users may replace your secrets in it. Run `chmod 700 {folder}`"
        )


def check_mounted(environ: Mapping[str, str]) -> None:
    """In a pod, fail when a Secret mounted as files is missing. Its volume is optional
    (:func:`kinetic._core.secret_spec.apply_secrets`), so a missing Secret leaves its
    folder empty instead of holding the pod before it starts, saying nothing.

    :raises SecretError: naming the Secret and its namespace.
    """
    told = environ.get(MOUNTS_ENV)
    if not told:
        return
    mounts = json.loads(told)
    namespace = mounts.get("namespace") or ""
    for record in mounts.get("secrets") or []:
        folder = Path(record["mount"])
        try:
            with os.scandir(folder) as entries:
                present = any(not entry.name.startswith("..") for entry in entries)
        except OSError:
            present = False
        if not present:
            raise SecretError(
                f"the Secret {record['name']!r} does not exist in namespace {namespace!r} "
                f"(or holds no keys): nothing to mount at {folder}. Create it "
                f"(kubectl create secret generic {record['name']} -n {namespace} ...), "
                "or fix secrets="
            )
