"""Where a job goes: pure resolution of settings.

Every field resolves with the precedence *argument > ``KINETIC_*`` environment
variable > active profile > default*. The project additionally falls back to
``GOOGLE_CLOUD_PROJECT``. With no project anywhere, the backend is ``local``.
The inputs (environment, profiles document) are passed in, so this module does
no IO and is tested without touching the machine.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kinetic._exceptions import ConfigError, ProfileError, format_choices

BACKENDS = ("local", "gke", "pathways")
DEFAULT_ZONE = "us-central1-a"
DEFAULT_CLUSTER = "kinetic-cluster"
DEFAULT_NAMESPACE = "default"
DEFAULT_BASE_IMAGE_REPO = "kinetic"
PROFILE_FIELDS = (
    "project",
    "zone",
    "cluster",
    "namespace",
    "base_image_repo",
    "builder",
    "build_install",
    "local_accelerator",
)


@dataclass(frozen=True)
class Settings:
    """The resolved target of a job."""

    backend: str
    project: str | None
    zone: str
    cluster: str
    namespace: str
    local_root: str
    backend_was_defaulted: bool = False
    """True when no backend was asked for and none could be inferred from a project."""
    base_image_repo: str = DEFAULT_BASE_IMAGE_REPO
    """Where prebuilt base images live (``{repo}/base-{category}:{version}-py{X.Y}``)."""
    builder: str | None = None
    """The image builder named by ``KINETIC_BUILDER`` or the profile (None: choose)."""
    build_install: str | None = None
    """How builds install an image's set, named by ``KINETIC_BUILD_INSTALL`` or the
    profile: ``index`` or ``wheels`` (None: per builder, see
    :func:`kinetic._core.index_install.choose_install`)."""
    local_accelerator: str | None = None
    """``KINETIC_LOCAL_ACCELERATOR`` or the profile: ``cpu`` runs TPU jobs locally on CPUs
    (None: a TPU accelerator is an error on the local backend)."""
    cluster_named: bool = False
    """True when the cluster or zone was named (argument, environment or profile), not
    defaulted: a job must then go to that cluster (:mod:`kinetic._core.kube_context`)."""

    @property
    def region(self) -> str:
        """The zone's region (``us-central1-a`` -> ``us-central1``)."""
        head, sep, tail = self.zone.rpartition("-")
        return head if sep and len(tail) == 1 else self.zone

    @property
    def default_registry(self) -> str:
        """Where bundled images go when ``KINETIC_IMAGE_REGISTRY`` is unset: the
        project's Artifact Registry repository ``kinetic`` in the zone's region."""
        if not self.project:
            raise ConfigError(
                "no registry for bundled images: set KINETIC_IMAGE_REGISTRY or a GCP project"
            )
        return f"{self.region}-docker.pkg.dev/{self.project}/kinetic"

    @property
    def bucket_name(self) -> str:
        """The jobs bucket: ``{project}-kn-{cluster}-jobs`` (GCS backends only)."""
        if not self.project:
            raise ConfigError("no GCP project configured: set KINETIC_PROJECT or pass project=")
        return f"{self.project}-kn-{self.cluster}-jobs"


def parse_profiles(document: Any, source: str) -> tuple[str | None, dict[str, dict[str, str]]]:
    """Validate a parsed profiles document; return (current profile name, profiles).

    :raises ProfileError: naming ``source`` when the document is malformed.
    """
    if not isinstance(document, dict):
        raise ProfileError(f"malformed profiles file {source}: expected a JSON object")
    current = document.get("current")
    if current is not None and not isinstance(current, str):
        raise ProfileError(f"malformed profiles file {source}: 'current' must be a string")
    raw = document.get("profiles", {})
    if not isinstance(raw, dict):
        raise ProfileError(f"malformed profiles file {source}: 'profiles' must be an object")
    profiles: dict[str, dict[str, str]] = {}
    for name, fields in raw.items():
        if not isinstance(fields, dict) or not all(
            isinstance(v, str) for k, v in fields.items() if k in PROFILE_FIELDS
        ):
            raise ProfileError(
                f"malformed profiles file {source}: profile {name!r} must map "
                f"{format_choices(PROFILE_FIELDS)} to strings"
            )
        profiles[name] = {k: v for k, v in fields.items() if k in PROFILE_FIELDS}
    if current is not None and current not in profiles:
        current = None  # a stale pointer is not worth failing a job for
    return current, profiles


def resolve_settings(
    *,
    backend: str | None = None,
    project: str | None = None,
    zone: str | None = None,
    cluster: str | None = None,
    namespace: str | None = None,
    base_image_repo: str | None = None,
    env: Mapping[str, str],
    profile: Mapping[str, str] | None,
    home: str,
) -> Settings:
    """Resolve every setting with precedence argument > env > profile > default.

    :raises ConfigError: for an unknown backend.
    """
    prof = profile or {}

    def pick(arg: str | None, var: str, field: str) -> str | None:
        return arg or env.get(var) or prof.get(field) or None

    resolved_project = pick(project, "KINETIC_PROJECT", "project") or env.get(
        "GOOGLE_CLOUD_PROJECT"
    )
    chosen = backend or env.get("KINETIC_BACKEND")
    defaulted = False
    if chosen is None:
        chosen = "gke" if resolved_project else "local"
        defaulted = resolved_project is None
    if chosen not in BACKENDS:
        raise ConfigError(f"unknown backend {chosen!r}; valid backends: {format_choices(BACKENDS)}")
    return Settings(
        backend=chosen,
        project=resolved_project,
        zone=pick(zone, "KINETIC_ZONE", "zone") or DEFAULT_ZONE,
        cluster=pick(cluster, "KINETIC_CLUSTER", "cluster") or DEFAULT_CLUSTER,
        namespace=pick(namespace, "KINETIC_NAMESPACE", "namespace") or DEFAULT_NAMESPACE,
        local_root=env.get("KINETIC_LOCAL_ROOT") or os.path.join(home, ".kinetic", "local"),
        backend_was_defaulted=defaulted,
        base_image_repo=pick(base_image_repo, "KINETIC_BASE_IMAGE_REPO", "base_image_repo")
        or DEFAULT_BASE_IMAGE_REPO,
        builder=pick(None, "KINETIC_BUILDER", "builder"),
        build_install=pick(None, "KINETIC_BUILD_INSTALL", "build_install"),
        local_accelerator=pick(None, "KINETIC_LOCAL_ACCELERATOR", "local_accelerator"),
        cluster_named=bool(
            pick(cluster, "KINETIC_CLUSTER", "cluster") or pick(zone, "KINETIC_ZONE", "zone")
        ),
    )


SETTING_SOURCES = ("argument", "environment", "profile", "default")
"""Where a setting's value can come from, in precedence order."""

SETTING_VARIABLES = {
    "backend": "KINETIC_BACKEND",
    "project": "KINETIC_PROJECT",
    "zone": "KINETIC_ZONE",
    "cluster": "KINETIC_CLUSTER",
    "namespace": "KINETIC_NAMESPACE",
    "base_image_repo": "KINETIC_BASE_IMAGE_REPO",
    "builder": "KINETIC_BUILDER",
    "build_install": "KINETIC_BUILD_INSTALL",
    "local_root": "KINETIC_LOCAL_ROOT",
    "local_accelerator": "KINETIC_LOCAL_ACCELERATOR",
}
"""Each resolved setting and the ``KINETIC_*`` variable that can set it."""


@dataclass(frozen=True)
class SettingSource:
    """One resolved setting and where its value came from.

    :ivar name: the :class:`Settings` field (``project``, ``zone``, ...).
    :ivar value: its resolved value (None: unset).
    :ivar source: one of :data:`SETTING_SOURCES`.
    :ivar detail: the variable, profile or rule behind the value, for humans
        (``KINETIC_ZONE``, ``profile 'dev'``, ``no project: local``), or None.
    """

    name: str
    value: str | None
    source: str
    detail: str | None = None


def explain_settings(
    settings: Settings,
    *,
    arguments: Mapping[str, str | None],
    env: Mapping[str, str],
    profile: Mapping[str, str] | None,
    profile_name: str | None = None,
) -> list[SettingSource]:
    """Where each field of ``settings`` came from, given the inputs it was resolved from.

    ``settings`` must be :func:`resolve_settings`'s answer for the same ``arguments``
    (keyword arguments by field name), ``env`` and ``profile``: the values shown are
    its values, and the sources follow the same rule (the first non-empty of
    argument > environment > profile, else the default). Pure.
    """
    prof = profile or {}
    where = f"profile {profile_name!r}" if profile_name else "profile"
    rows: list[SettingSource] = []
    for name, var in SETTING_VARIABLES.items():
        value = getattr(settings, name)
        if arguments.get(name):
            rows.append(SettingSource(name, value, "argument"))
        elif env.get(var):
            rows.append(SettingSource(name, value, "environment", var))
        elif name in PROFILE_FIELDS and prof.get(name):
            rows.append(SettingSource(name, value, "profile", where))
        elif name == "project" and env.get("GOOGLE_CLOUD_PROJECT"):
            rows.append(SettingSource(name, value, "environment", "GOOGLE_CLOUD_PROJECT"))
        elif name == "backend":
            rule = "a project is set: gke" if settings.project else "no project: local"
            rows.append(SettingSource(name, value, "default", rule))
        elif name == "builder":
            rows.append(SettingSource(name, value, "default", "chosen per build"))
        elif name == "build_install":
            rule = "index on cloudbuild, wheels on docker"
            rows.append(SettingSource(name, value, "default", rule))
        else:
            rows.append(SettingSource(name, value, "default"))
    return rows


def capture_env(patterns: list[str] | None, environ: Mapping[str, str]) -> dict[str, str]:
    """Select variables to send with the job: exact names, or ``PREFIX*`` patterns.

    :raises ConfigError: when ``patterns`` is not a list of strings.
    """
    if not patterns:
        return {}
    if isinstance(patterns, str) or not all(isinstance(p, str) for p in patterns):
        raise ConfigError("capture_env_vars must be a list of names or 'PREFIX*' patterns")
    captured: dict[str, str] = {}
    for pattern in patterns:
        if pattern.endswith("*"):
            prefix = pattern[:-1]
            captured.update({k: v for k, v in environ.items() if k.startswith(prefix)})
        elif pattern in environ:
            captured[pattern] = environ[pattern]
    return captured


_SECRET_WORDS = re.compile(
    r"(TOKEN|SECRET|PASSW(OR)?D|PASSPHRASE|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIALS?|AUTH)",
    re.IGNORECASE,
)


def secret_like(names: Iterable[str]) -> list[str]:
    """The names, of those given, that look like they hold a secret (``HF_TOKEN``,
    ``AWS_SECRET_ACCESS_KEY``, ``DB_PASSWORD``, ...), sorted."""
    return sorted(name for name in names if _SECRET_WORDS.search(name))
