"""``kinetic config show``: every setting, its value, and where the value came from.

    kinetic [--backend B --project P --zone Z --cluster C --namespace N] config show [--json]

Sources, in precedence order: ``argument`` (the options before ``config``),
``environment`` (a ``KINETIC_*`` variable, named in the detail), ``profile`` (the
active profile of the profiles file) and ``default``. Values derived from others
(the jobs bucket, the image registry) say what they were derived from. Knobs that
only variables set (``KINETIC_GKE_*``, ``KINETIC_K8S_*``, image options) follow, then
any other ``KINETIC_*`` variable set in the environment. ``--json`` prints a list of
objects with ``name``, ``value``, ``source`` and ``detail``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from kinetic._cli._output import EXIT_OK, emit_json, report_error, table
from kinetic._core.config import Settings, SettingSource
from kinetic._exceptions import KineticError

KNOBS: tuple[tuple[str, str, str], ...] = (
    (
        "gke_service_account",
        "KINETIC_GKE_SERVICE_ACCOUNT",
        "kinetic if `kinetic up` made it, else the namespace's",
    ),
    ("gke_host_network", "KINETIC_GKE_HOST_NETWORK", "false"),
    ("gke_image_pull_policy", "KINETIC_GKE_IMAGE_PULL_POLICY", "Kubernetes' choice"),
    ("gke_start_grace", "KINETIC_GKE_START_GRACE", "300 seconds"),
    ("k8s_qps", "KINETIC_K8S_QPS", "20"),
    ("k8s_burst", "KINETIC_K8S_BURST", "40"),
    ("image_base", "KINETIC_IMAGE_BASE", "python:3.11-slim"),
    ("build_ca_bundle", "KINETIC_BUILD_CA_BUNDLE", "the image pip's own CAs"),
    ("package_root", "KINETIC_PACKAGE_ROOT", "found from the function's file"),
    ("cache_dir", "KINETIC_CACHE_DIR", "~/.kinetic/cache"),
)
"""Settings only a variable sets: (name, variable, what applies when it is unset)."""


def derived_rows(settings: Settings, env: Mapping[str, str]) -> list[SettingSource]:
    """The jobs bucket and the bundled-image registry, with what they derive from. Pure."""
    bucket = (
        SettingSource("bucket", settings.bucket_name, "default", "{project}-kn-{cluster}-jobs")
        if settings.project
        else SettingSource("bucket", None, "default", "needs a project")
    )
    if env.get("KINETIC_IMAGE_REGISTRY"):
        registry = SettingSource(
            "image_registry", env["KINETIC_IMAGE_REGISTRY"], "environment", "KINETIC_IMAGE_REGISTRY"
        )
    elif settings.project:
        registry = SettingSource(
            "image_registry",
            settings.default_registry,
            "default",
            "the project's Artifact Registry",
        )
    else:
        registry = SettingSource("image_registry", None, "default", "needs a project")
    return [bucket, registry]


_PROFILE_VARIABLES = ("KINETIC_PROFILE", "KINETIC_PROFILES_FILE")


def profile_rows(path: str, active: str | None, env: Mapping[str, str]) -> list[SettingSource]:
    """Which profiles file is read and which of its profiles is active. Pure."""
    if env.get("KINETIC_PROFILES_FILE"):
        file_row = SettingSource("profiles_file", path, "environment", "KINETIC_PROFILES_FILE")
    else:
        file_row = SettingSource("profiles_file", path, "default")
    if env.get("KINETIC_PROFILE"):
        active_row = SettingSource("profile", active, "environment", "KINETIC_PROFILE")
    elif active:
        active_row = SettingSource("profile", active, "profile", "the file's current profile")
    else:
        active_row = SettingSource("profile", None, "default", "no active profile")
    return [file_row, active_row]


def knob_rows(env: Mapping[str, str], shown: Sequence[str] = ()) -> list[SettingSource]:
    """The variable-only knobs, then every other ``KINETIC_*`` variable set in ``env``
    whose name is not in ``shown``. Pure."""
    rows: list[SettingSource] = []
    named = set(shown)
    for name, var, default in KNOBS:
        named.add(var)
        if env.get(var):
            rows.append(SettingSource(name, env[var], "environment", var))
        else:
            rows.append(SettingSource(name, None, "default", default))
    for var in sorted(env):
        if var.startswith("KINETIC_") and var not in named and env[var]:
            rows.append(SettingSource(var, env[var], "environment", var))
    return rows


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``config`` command group."""
    p = sub.add_parser("config", help="show the settings and where they come from")
    actions = p.add_subparsers(dest="action", required=True)
    show = actions.add_parser(
        "show",
        help="every setting with its value and source",
        description="Every setting, its value, and where it came from.",
    )
    show.add_argument("--json", action="store_true", help="one JSON list on stdout")


def run(ns: argparse.Namespace) -> int:
    """Run ``config show``; return the exit status."""
    from kinetic._core.config import SETTING_VARIABLES
    from kinetic._settings import active_profile_entry, load_settings_explained, profiles_path

    try:
        settings, rows = load_settings_explained(
            backend=ns.backend,
            project=ns.project,
            zone=ns.zone,
            cluster=ns.cluster,
            namespace=ns.namespace,
        )
        env = dict(os.environ)
        rows += derived_rows(settings, env)
        rows += profile_rows(str(profiles_path()), active_profile_entry()[0], env)
    except KineticError as exc:
        return report_error(exc)
    shown = [*SETTING_VARIABLES.values(), "KINETIC_IMAGE_REGISTRY", *_PROFILE_VARIABLES]
    rows += knob_rows(env, shown=shown)
    if ns.json:
        emit_json([asdict(r) for r in rows])
        return EXIT_OK
    body: list[list[Any]] = [[r.name, r.value, r.source, r.detail] for r in rows]
    table(("setting", "value", "source", "detail"), body, title="settings")
    return EXIT_OK
