"""Secrets by reference: ``secrets=`` of ``@kinetic.run``, checked, recorded, and placed
in a pod's manifest. Pure: values never pass through here, only names.

A job names Kubernetes Secrets (``kinetic.Secret``, or a plain name); its pod reads
them from the API server when it starts:

- ``"db"`` (or ``Secret("db")``): every key of Secret ``db`` as an environment
  variable (``envFrom[].secretRef``; below the job's other variables, as Kubernetes
  orders them);
- ``Secret("db", keys={"password": "DB_PASSWORD"})``: the chosen keys, each as the
  variable it maps to (``env[].valueFrom.secretKeyRef``, above captured variables);
- ``Secret("certs", mount="/etc/certs")``: every key as a file in that directory, a
  ``secret`` volume mounted read-only, files mode ``0400``.

A job's storage (its spec, a batch's manifest) records the references only
(:class:`~runner.protocol.SecretRecord`): a resumed or attached batch builds the same
pods. The local backend resolves the same references on this machine
(:mod:`runner.secrets`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kinetic._core import runner_delivery
from kinetic._exceptions import ConfigError
from runner import secrets as runner_secrets
from runner.protocol import FUSE_ROOT, SecretRecord

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SECRET_NAME = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*\Z")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+\Z")
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
MAX_NAME = 253

FILE_MODE = 0o400
"""Mode of a mounted secret's files: read by the container's user only."""

_SYSTEM_DIRS = frozenset(
    {"/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/root", "/run",
     "/sbin", "/sys", "/tmp", "/usr", "/var"}
)  # fmt: skip
"""Directories a secret would hide whole: refused as mount paths (``/etc/certs`` is fine)."""
_KINETIC_MOUNTS = (FUSE_ROOT, runner_delivery.MOUNT, "/dev", "/proc", "/sys")
"""Kinetic's own mounts and the kernel's trees: a secret may be neither in nor above one."""


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a secret's name must be a non-empty string, got {name!r}")
    if len(name) > MAX_NAME or not _SECRET_NAME.match(name):
        raise ConfigError(
            f"secret name {name!r} is not a Kubernetes Secret name: lowercase letters, "
            "digits, '-' and '.', starting and ending with a letter or digit "
            f"(at most {MAX_NAME} characters)"
        )
    return name


def check_variable(name: object, *, secret: str) -> str:
    """``name`` if it can be a variable a secret's key is mapped to.

    :raises ConfigError: not a variable name, or one Kinetic sets itself.
    """
    if not isinstance(name, str) or not _VARIABLE.match(name):
        raise ConfigError(
            f"secret {secret!r}: {name!r} is not an environment variable name "
            "(letters, digits and '_', not starting with a digit)"
        )
    if name == "JOB_ID" or name.startswith("KINETIC_"):
        raise ConfigError(f"secret {secret!r}: {name} is set by Kinetic; map the key to another")
    return name


def check_mount(path: object, *, secret: str) -> str:
    """``path`` normalized, if a secret's files may be mounted there.

    :raises ConfigError: a relative path, ``/`` or a system directory, or a path in or
        above one of Kinetic's own mounts.
    """
    if not isinstance(path, str) or not path.startswith("/"):
        raise ConfigError(f"secret {secret!r}: mount must be an absolute path, got {path!r}")
    normal = os.path.normpath(path)
    if normal == "/" or normal in _SYSTEM_DIRS:
        raise ConfigError(
            f"secret {secret!r}: mount={path!r} would hide the whole directory; "
            "mount it in a folder of its own (e.g. /etc/certs)"
        )
    for own in _KINETIC_MOUNTS:
        if _nested(normal, own):
            raise ConfigError(
                f"secret {secret!r}: mount={path!r} overlaps {own}, where Kinetic or the "
                "kernel mounts its own; choose another folder"
            )
    return normal


def _nested(a: str, b: str) -> bool:
    """Whether one of two normalized paths is the other or lies inside it."""
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


@dataclass(frozen=True)
class Secret:
    """A Kubernetes Secret a job reads, by name: its value never travels with the job.

    ``Secret("db")`` (or just ``"db"`` in ``secrets=``) gives the job every key of
    Secret ``db`` as an environment variable; ``keys={"password": "DB_PASSWORD"}``
    only the named keys, each as the variable it maps to; ``mount="/etc/certs"`` every
    key as a read-only file (mode ``0400``) in that folder (GKE only).

    On the local backend the same names resolve from ``~/.kinetic/secrets/{name}.json``
    (mode ``0600``), or, for mapped keys, from the submitting environment
    (docs/environment-variables.md).

    :raises ConfigError: for a name that is not a Kubernetes Secret name, a key or
        variable that cannot be one, both ``keys`` and ``mount``, or a mount path that
        is relative or hides a system or Kinetic folder.
    """

    name: str
    keys: Mapping[str, str] | None = field(default=None, hash=False)
    mount: str | None = None

    def __post_init__(self) -> None:
        _check_name(self.name)
        if self.keys is not None and self.mount is not None:
            raise ConfigError(
                f"secret {self.name!r}: give keys= (variables) or mount= (files), not both; "
                "list the secret twice for both"
            )
        if self.keys is not None:
            if not isinstance(self.keys, Mapping) or not self.keys:
                raise ConfigError(
                    f"secret {self.name!r}: keys must be a non-empty dict of key -> "
                    f"variable name, got {self.keys!r}"
                )
            for key, variable in self.keys.items():
                if not isinstance(key, str) or not _SECRET_KEY.match(key):
                    raise ConfigError(
                        f"secret {self.name!r}: {key!r} is not a Secret key "
                        "(letters, digits, '-', '_' and '.')"
                    )
                check_variable(variable, secret=self.name)
            object.__setattr__(self, "keys", dict(self.keys))
        if self.mount is not None:
            object.__setattr__(self, "mount", check_mount(self.mount, secret=self.name))

    def record(self) -> SecretRecord:
        """The reference as storage records it (no value)."""
        out: SecretRecord = {"name": self.name}
        if self.keys is not None:
            out["keys"] = dict(self.keys)
        if self.mount is not None:
            out["mount"] = self.mount
        return out


def from_record(record: SecretRecord) -> Secret:
    """The :class:`Secret` a stored reference names.

    :raises ConfigError: a malformed reference.
    """
    return Secret(record["name"], keys=record.get("keys"), mount=record.get("mount"))


def check_secrets(secrets: object) -> tuple[Secret, ...]:
    """``secrets=`` as :class:`Secret` values, checked together.

    :raises ConfigError: not a list of names and ``kinetic.Secret``; an invalid one; one
        variable given by two secrets; two mounts in one another.
    """
    if isinstance(secrets, (str, Secret)):
        raise ConfigError(f"secrets must be a list, e.g. [{secrets!r}], not {secrets!r}")
    if not isinstance(secrets, (list, tuple)):
        raise ConfigError(
            f"secrets must be a list of Secret names or kinetic.Secret, got "
            f"{type(secrets).__name__} {secrets!r}"
        )
    out: list[Secret] = []
    for item in secrets:
        if isinstance(item, str):
            item = Secret(item)
        elif not isinstance(item, Secret):
            raise ConfigError(
                f"secrets must hold Secret names or kinetic.Secret, got "
                f"{type(item).__name__} {item!r}"
            )
        out.append(item)
    variables: dict[str, str] = {}
    mounts: dict[str, str] = {}
    for secret in out:
        for variable in (secret.keys or {}).values():
            if variable in variables:
                raise ConfigError(
                    f"{variable} is given by secret {variables[variable]!r} and by "
                    f"secret {secret.name!r}; map one of them to another name"
                )
            variables[variable] = secret.name
        if secret.mount is not None:
            for other, name in mounts.items():
                if _nested(secret.mount, other):
                    raise ConfigError(
                        f"secrets {name!r} and {secret.name!r} are mounted at {other} and "
                        f"{secret.mount}, one in the other; give each a folder of its own"
                    )
            mounts[secret.mount] = secret.name
    return tuple(out)


def check_volume_overlap(secrets: Iterable[Secret], volume_paths: Iterable[str]) -> None:
    """:raises ConfigError: a secret mounted in, or above, one of the job's volumes."""
    paths = [os.path.normpath(p) for p in volume_paths]
    for secret in secrets:
        for path in paths:
            if secret.mount is not None and _nested(secret.mount, path):
                raise ConfigError(
                    f"secret {secret.name!r} is mounted at {secret.mount}, which overlaps "
                    f"the volume at {path}; give it a folder of its own"
                )


def records(secrets: Iterable[Secret]) -> list[SecretRecord]:
    """The references of ``secrets``, as stored."""
    return [s.record() for s in secrets]


VOLUME_PREFIX = "kinetic-secret-"
MOUNTS_ENV = runner_secrets.MOUNTS_ENV


def apply_secrets(pod_spec: dict[str, Any], secrets: Sequence[Secret], *, namespace: str) -> None:
    """Make the pod's first container read ``secrets`` (module docstring). Mapped
    variables replace a plain variable of the same name (a captured one).

    A missing Secret read as variables stops the container before it starts
    (``CreateContainerConfigError``, which the job's status names:
    :func:`missing_secret`). One mounted as files would hold the pod in
    ``ContainerCreating`` for ever, saying why in an event only: its volume is
    ``optional`` instead, and the runner, told the mounts (:data:`MOUNTS_ENV`), fails
    the job in phase ``secrets`` naming the Secret when its folder is empty
    (:func:`runner.secrets.check_mounted`).
    """
    if not secrets:
        return
    container = pod_spec["containers"][0]
    mapped = {v for s in secrets for v in (s.keys or {}).values()}
    env = [var for var in container.get("env", []) if var["name"] not in mapped]
    mounted: list[SecretRecord] = []
    for n, secret in enumerate(secrets):
        if secret.mount is not None:
            volume = f"{VOLUME_PREFIX}{n}"
            pod_spec.setdefault("volumes", []).append(
                {
                    "name": volume,
                    "secret": {
                        "secretName": secret.name,
                        "defaultMode": FILE_MODE,
                        "optional": True,
                    },
                }
            )
            mounted.append(secret.record())
            container.setdefault("volumeMounts", []).append(
                {"name": volume, "mountPath": secret.mount, "readOnly": True}
            )
        elif secret.keys is not None:
            env += [
                {"name": var, "valueFrom": {"secretKeyRef": {"name": secret.name, "key": key}}}
                for key, var in sorted(secret.keys.items(), key=lambda kv: kv[1])
            ]
        else:
            container.setdefault("envFrom", []).append({"secretRef": {"name": secret.name}})
    if mounted:
        value = json.dumps({"namespace": namespace, "secrets": mounted}, sort_keys=True)
        env.append({"name": MOUNTS_ENV, "value": value})
    container["env"] = env


_MISSING = re.compile(r'secrets? "([^"]+)" not found')
_MISSING_KEY = re.compile(r"couldn't find key (\S+) in Secret ([^/\s]+)/(\S+)")


def missing_secret(message: str, namespace: str) -> str | None:
    """What a kubelet's message (a container's ``CreateContainerConfigError``, a
    ``FailedMount`` event) says of a job's Secret, in words that name it and its
    namespace; None when it is about something else."""
    match = _MISSING.search(message)
    if match:
        where = f" in namespace {namespace!r}" if namespace else ""
        return (
            f"the Secret {match.group(1)!r} does not exist{where}: create it "
            f"(kubectl create secret generic {match.group(1)} ...) or fix secrets="
        )
    match = _MISSING_KEY.search(message)
    if match:
        key, ns, name = match.groups()
        return f"the Secret {name!r} in namespace {ns!r} has no key {key!r}"
    return None
