"""The decisions of ``kinetic init``, without IO: what was found, which way to go, and
what the saved profile holds.

``kinetic init`` goes one of four ways (:data:`CHOICES`): *join* a GKE cluster that
exists, *create* one (``kinetic up``), go *local* (no cloud), or run the *doctor*.
Which way is the user's, through a flag or a prompt; :func:`default_choice` is the
way offered first (and taken by ``--yes`` alone): local without Google credentials or
a project, join when there is a cluster to join, else create (which ``--yes`` alone
never takes: it costs money, so it must be asked for with ``--create``).
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kinetic._cli.doctor_result import CheckResult, ok, warn
from kinetic._exceptions import ConfigError

CHOICES = ("join", "create", "local", "doctor")
FLAGS = "--local, --join CLUSTER, --create or --doctor"
"""The flags that make the choice, as messages name them."""
LOCAL_PROFILE = "local"
OVERRIDING_VARIABLES = ("KINETIC_BACKEND", "KINETIC_PROJECT", "GOOGLE_CLOUD_PROJECT")
"""Variables that take precedence over the saved profile's choice of backend."""


@dataclass(frozen=True)
class Found:
    """What ``init`` learnt before asking anything.

    :ivar credentials: where the Google credentials are (None: none found).
    :ivar project: the GCP project from the settings or gcloud's configuration.
    :ivar project_source: where ``project`` came from, in words.
    :ivar gcloud: the gcloud CLI's path (None: not installed).
    :ivar clusters: the project's clusters as (name, location), when they were listed.
    :ivar cluster_error: why they could not be listed.
    """

    credentials: str | None
    project: str | None
    project_source: str | None = None
    gcloud: str | None = None
    clusters: tuple[tuple[str, str], ...] = ()
    cluster_error: str | None = None

    @property
    def cloud(self) -> bool:
        """Whether a GKE cluster can be reached for: credentials and a project."""
        return bool(self.credentials and self.project)


def credentials_path(env: Mapping[str, str], home: str) -> str | None:
    """Where Application Default Credentials are looked for first, as the Google auth
    library looks (``GOOGLE_APPLICATION_CREDENTIALS``, else gcloud's
    ``application_default_credentials.json`` under ``CLOUDSDK_CONFIG`` or
    ``~/.config/gcloud``). Pure."""
    explicit = env.get("GOOGLE_APPLICATION_CREDENTIALS")
    if explicit:
        return explicit
    config = env.get("CLOUDSDK_CONFIG") or os.path.join(home, ".config", "gcloud")
    return os.path.join(config, "application_default_credentials.json")


def gcloud_project(text: str | None) -> str | None:
    """The ``[core] project`` of a gcloud configuration file's ``text``. Pure."""
    if not text:
        return None
    parser = configparser.ConfigParser()
    try:
        parser.read_string(text)
    except configparser.Error:
        return None
    value = parser.get("core", "project", fallback=None)
    return (value or "").strip() or None


def credential_result(path: str | None, exists: bool, metadata_host: str | None) -> CheckResult:
    """The ``credentials`` check: Google credentials, which GKE needs and local does
    not. Pure."""
    if path and exists:
        return ok("credentials", f"Application Default Credentials: {path}")
    if metadata_host:
        return ok("credentials", f"the metadata server at {metadata_host}")
    where = f" ({path} does not exist)" if path else ""
    return warn(
        "credentials",
        f"no Google credentials{where}: the local backend needs none",
        "for GKE: gcloud auth application-default login",
    )


def gcloud_result(path: str | None) -> CheckResult:
    """The ``gcloud`` check: the CLI makes credentials and kubeconfig entries. Pure."""
    if path:
        return ok("gcloud", path)
    return warn(
        "gcloud",
        "the gcloud CLI is not installed: not needed by the local backend",
        "for GKE: install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install)",
    )


def project_result(found: Found) -> CheckResult:
    """The ``project`` check. Pure."""
    if found.project:
        return ok("project", f"{found.project} ({found.project_source or 'settings'})")
    return warn(
        "project",
        "no GCP project: the local backend needs none",
        "for GKE: --project P, or gcloud config set project P",
    )


def default_choice(found: Found) -> str:
    """The way offered first: ``local`` without credentials or a project, ``join`` when
    the project has a cluster, else ``create``. Pure."""
    if not found.cloud:
        return "local"
    if found.clusters:
        return "join"
    return "create"


def cluster_to_join(
    found: Found, wanted: str | None, zone: str | None = None
) -> tuple[str, str] | None:
    """The (name, location) of the cluster to join: ``wanted`` (in ``zone`` when
    given), else the only cluster there is; None when that is not one cluster. Pure.
    """
    if wanted is not None:
        matches = [c for c in found.clusters if c[0] == wanted and zone in (None, c[1])]
        return matches[0] if len(matches) == 1 else None
    return found.clusters[0] if len(found.clusters) == 1 else None


def not_a_terminal(yes: bool) -> str:
    """What ``init`` says when it would have to ask and stdin is no terminal. Pure."""
    if yes:
        return (
            f"init: nothing to go on without asking: choose with {FLAGS} "
            "(--yes alone only joins the one cluster found, or goes local)"
        )
    return (
        f"init asks which way to go, and stdin is not a terminal: pass {FLAGS} "
        "(with --yes to accept the default answers)"
    )


def profile_name(choice: str, cluster: str | None, name: str | None) -> str:
    """The saved profile's name: ``name``, else the cluster's, else ``local``. Pure."""
    if name:
        return name
    return cluster if choice in ("join", "create") and cluster else LOCAL_PROFILE


def profile_fields(
    choice: str,
    *,
    project: str | None,
    zone: str | None,
    cluster: str | None,
    namespace: str | None,
) -> dict[str, str]:
    """The profile ``init`` saves: nothing for ``local`` (no project: the local
    backend), the cluster's project, zone, cluster (and a namespace other than the
    default) otherwise. Pure.

    :raises ConfigError: ``join``/``create`` without a project, zone or cluster.
    """
    if choice == "local":
        return {}
    if not (project and zone and cluster):
        raise ConfigError(f"init --{choice} needs a project, zone and cluster")
    fields = {"project": project, "zone": zone, "cluster": cluster}
    if namespace and namespace != "default":
        fields["namespace"] = namespace
    return fields


def reconcile(
    document: Mapping[str, Any], name: str, fields: Mapping[str, str]
) -> tuple[str, Mapping[str, str] | None]:
    """Whether saving ``fields`` as profile ``name`` creates it (``"created"``), finds
    it as it is (``"kept"``) or would change it (``"replaced"``, with the old fields).
    Pure."""
    old = (document.get("profiles") or {}).get(name)
    if old is None:
        return "created", None
    if dict(old) == dict(fields):
        return "kept", old
    return "replaced", old


def overriding(env: Mapping[str, str], choice: str) -> list[str]:
    """The variables set in ``env`` that would send jobs elsewhere than the profile
    ``init`` saved says. Pure."""
    if choice != "local":
        names = [n for n in ("KINETIC_BACKEND",) if env.get(n) == "local"]
        return names + [
            n for n in ("KINETIC_PROJECT", "KINETIC_ZONE", "KINETIC_CLUSTER") if env.get(n)
        ]
    return [
        n
        for n in OVERRIDING_VARIABLES
        if env.get(n) and not (n == "KINETIC_BACKEND" and env[n] == "local")
    ]


def get_credentials_command(project: str, location: str, cluster: str) -> list[str]:
    """The gcloud command that adds the cluster's kubeconfig context
    (``gke_{project}_{location}_{cluster}``, the one jobs look for). Pure."""
    flag = "--zone" if _is_zone(location) else "--region"
    return [
        "gcloud",
        "container",
        "clusters",
        "get-credentials",
        cluster,
        flag,
        location,
        "--project",
        project,
    ]


def _is_zone(location: str) -> bool:
    head, sep, tail = location.rpartition("-")
    return bool(sep) and len(tail) == 1 and head.count("-") >= 1


def next_steps(choice: str) -> list[str]:
    """What to do after ``init``. Pure."""
    if choice == "local":
        return [
            "run a function on this machine: @kinetic.run() def f(): ...; f()",
            "kinetic jobs list    see the jobs",
        ]
    return [
        "kinetic doctor       check the cluster is ready for jobs",
        "kinetic status       what `kinetic up` set up",
        "kinetic jobs list    see the jobs",
    ]


def menu(found: Found, cluster: str, zone: str) -> list[tuple[str, str]]:
    """The choices as (choice, what it does), for the prompt. Pure."""
    if found.clusters:
        names = ", ".join(f"{n} ({loc})" for n, loc in found.clusters)
        join = f"use a GKE cluster of project {found.project}: {names}"
    elif found.cloud:
        why = f": {found.cluster_error}" if found.cluster_error else ""
        join = f"use a GKE cluster of project {found.project} (none listed{why})"
    else:
        join = "use a GKE cluster (needs Google credentials and a project)"
    create = (
        f"create GKE cluster {cluster} in {zone} of project {found.project} (kinetic up)"
        if found.cloud
        else "create a GKE cluster (needs Google credentials and a project)"
    )
    return [
        ("join", join),
        ("create", create),
        ("local", "run jobs on this machine: no cloud needed"),
        ("doctor", "troubleshoot: check this machine and the cluster (kinetic doctor)"),
    ]


def parse_answer(answer: str, default: str, options: Sequence[str]) -> str | None:
    """A menu answer: a choice's name, a unique prefix of one, or its number (empty:
    ``default``); None when it is none of these. Pure."""
    text = answer.strip().lower()
    if not text:
        return default
    if text.isdigit() and 1 <= int(text) <= len(options):
        return options[int(text) - 1]
    hits = [o for o in options if o.startswith(text)]
    return hits[0] if len(hits) == 1 else None
