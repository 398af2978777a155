"""Read the machine's configuration: environment and ``~/.kinetic/profiles.json``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from kinetic._core.config import Settings, parse_profiles, resolve_settings
from kinetic._exceptions import ProfileError


def profiles_path() -> Path:
    """``KINETIC_PROFILES_FILE``, else ``~/.kinetic/profiles.json``."""
    override = os.environ.get("KINETIC_PROFILES_FILE")
    return Path(override) if override else Path.home() / ".kinetic" / "profiles.json"


def active_profile() -> dict[str, str] | None:
    """The profile named by ``KINETIC_PROFILE`` or the file's ``current``; None if none.

    :raises ProfileError: when the file exists but is malformed (the message names it),
        or ``KINETIC_PROFILE`` names a profile the file does not have.
    """
    path = profiles_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ProfileError(f"cannot read profiles file {path}: {exc}") from exc
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"malformed profiles file {path}: {exc}") from exc
    current, profiles = parse_profiles(document, str(path))
    wanted = os.environ.get("KINETIC_PROFILE") or current
    if wanted is None:
        return None
    if wanted not in profiles:
        raise ProfileError(f"profile {wanted!r} (KINETIC_PROFILE) is not in {path}")
    return profiles[wanted]


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
