"""Read the machine's configuration: environment and ``~/.kinetic/profiles.json``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from kinetic._core.config import (
    Settings,
    SettingSource,
    explain_settings,
    parse_profiles,
    resolve_settings,
)
from kinetic._exceptions import ProfileError


def profiles_path() -> Path:
    """``KINETIC_PROFILES_FILE``, else ``~/.kinetic/profiles.json``."""
    override = os.environ.get("KINETIC_PROFILES_FILE")
    return Path(override) if override else Path.home() / ".kinetic" / "profiles.json"


def active_profile() -> dict[str, str] | None:
    """The profile named by ``KINETIC_PROFILE`` or the file's ``current``; None if none.

    :raises ProfileError: when the file exists but is malformed (the message names it),
        or ``KINETIC_PROFILE`` names a profile the file does not have (or there is no
        file).
    """
    return active_profile_entry()[1]


def active_profile_entry() -> tuple[str | None, dict[str, str] | None]:
    """``(name, fields)`` of the active profile (see :func:`active_profile`), or
    ``(None, None)`` when no profile is active.

    :raises ProfileError: as :func:`active_profile`.
    """
    path = profiles_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        wanted = os.environ.get("KINETIC_PROFILE")
        if wanted:  # asked for by name: not silently the defaults
            raise ProfileError(
                f"profile {wanted!r} (KINETIC_PROFILE) does not exist: there is no profiles "
                f"file {path} (create it with `kinetic profile create {wanted} ...`)"
            ) from None
        return None, None
    except OSError as exc:
        raise ProfileError(f"cannot read profiles file {path}: {exc}") from exc
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"malformed profiles file {path}: {exc}") from exc
    current, profiles = parse_profiles(document, str(path))
    wanted = os.environ.get("KINETIC_PROFILE") or current
    if wanted is None:
        return None, None
    if wanted not in profiles:
        raise ProfileError(f"profile {wanted!r} (KINETIC_PROFILE) is not in {path}")
    return wanted, profiles[wanted]


def load_settings(
    *,
    backend: str | None = None,
    project: str | None = None,
    zone: str | None = None,
    cluster: str | None = None,
    namespace: str | None = None,
    base_image_repo: str | None = None,
) -> Settings:
    """Resolve settings from arguments, the environment and the active profile."""
    return resolve_settings(
        backend=backend,
        project=project,
        zone=zone,
        cluster=cluster,
        namespace=namespace,
        base_image_repo=base_image_repo,
        env=os.environ,
        profile=active_profile(),
        home=str(Path.home()),
    )


def load_settings_explained(
    *,
    backend: str | None = None,
    project: str | None = None,
    zone: str | None = None,
    cluster: str | None = None,
    namespace: str | None = None,
) -> tuple[Settings, list[SettingSource]]:
    """:func:`load_settings`, plus where each value came from (``kinetic config show``).

    :raises ConfigError: as :func:`load_settings` (a malformed profiles file, an
        unknown backend).
    """
    arguments = {
        "backend": backend,
        "project": project,
        "zone": zone,
        "cluster": cluster,
        "namespace": namespace,
    }
    name, profile = active_profile_entry()
    env = dict(os.environ)
    settings = resolve_settings(**arguments, env=env, profile=profile, home=str(Path.home()))
    rows = explain_settings(
        settings, arguments=arguments, env=env, profile=profile, profile_name=name
    )
    return settings, rows
