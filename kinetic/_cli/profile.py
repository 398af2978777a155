"""``kinetic profile``: named sets of settings in the profiles file.

    kinetic profile create NAME [--project P --zone Z --cluster C --namespace N
                                 --base-image-repo R --builder B] [--use] [--force]
    kinetic profile ls [--json]
    kinetic profile use NAME
    kinetic profile show [NAME] [--json]      default: the active profile
    kinetic profile rm NAME [-y]              asks first on a terminal; -y does not
    kinetic profile unset                     no current profile (the defaults apply)

The file is ``KINETIC_PROFILES_FILE``, else ``~/.kinetic/profiles.json`` (``$HOME``
decides ``~``), in the format jobs read::

    {"current": "dev", "profiles": {"dev": {"project": "p", "zone": "us-central1-a"}}}

Keys this version does not know (at the top level or in a profile) are kept as
they are. The file is replaced atomically and is private to its owner (0600, in a
0700 directory). The active profile is ``KINETIC_PROFILE`` when set, else
``current``; its fields sit between the ``KINETIC_*`` variables and the defaults.
A missing profile exits with status 3; a name that exists already, with 2.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from kinetic._cli._output import EXIT_FAILED, EXIT_OK, emit_json, report_error, table
from kinetic._core.config import PROFILE_FIELDS, parse_profiles
from kinetic._exceptions import ConfigError, KineticError, ProfileError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class ProfileNotFoundError(ProfileError, LookupError):
    """The profiles file has no profile of that name (exit status 3)."""


# --------------------------------------------------------------------------- pure edits


def check_name(name: str) -> str:
    """``name`` if it is a usable profile name (letters, digits, ``_ . -``).

    :raises ConfigError: otherwise.
    """
    if not _NAME.fullmatch(name):
        raise ConfigError(f"invalid profile name {name!r}: use letters, digits, '_', '.', '-'")
    return name


def with_profile(
    document: dict[str, Any], name: str, fields: dict[str, str], *, replace: bool
) -> dict[str, Any]:
    """A copy of ``document`` holding profile ``name`` with ``fields``. Pure.

    :raises ConfigError: ``name`` exists and not ``replace``, or is not a valid name.
    """
    check_name(name)
    doc = copy.deepcopy(document)
    profiles = doc.setdefault("profiles", {})
    if name in profiles and not replace:
        raise ConfigError(f"profile {name!r} exists already (--force replaces it)")
    profiles[name] = dict(fields)
    return doc


def with_current(document: dict[str, Any], name: str) -> dict[str, Any]:
    """A copy of ``document`` whose current profile is ``name``. Pure.

    :raises ProfileNotFoundError: the document has no such profile.
    """
    doc = copy.deepcopy(document)
    if name not in doc.get("profiles", {}):
        raise ProfileNotFoundError(f"no profile {name!r}")
    doc["current"] = name
    return doc


def without_profile(document: dict[str, Any], name: str) -> dict[str, Any]:
    """A copy of ``document`` without profile ``name`` (and not current any more). Pure.

    :raises ProfileNotFoundError: the document has no such profile.
    """
    doc = copy.deepcopy(document)
    if name not in doc.get("profiles", {}):
        raise ProfileNotFoundError(f"no profile {name!r}")
    del doc["profiles"][name]
    if doc.get("current") == name:
        del doc["current"]
    return doc


def without_current(document: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``document`` with no current profile. Pure."""
    doc = copy.deepcopy(document)
    doc.pop("current", None)
    return doc


def _confirmed(question: str) -> bool:
    """Ask ``question`` on a terminal; without one (a script), go on as before ``-y``
    existed."""
    if not sys.stdin.isatty():
        return True
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


# --------------------------------------------------------------------------- the file


def read_document(path: Path) -> dict[str, Any]:
    """The profiles file's document (empty when the file does not exist), validated.

    :raises ProfileError: the file cannot be read or is malformed (names the file).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {"profiles": {}}
    except OSError as exc:
        raise ProfileError(f"cannot read profiles file {path}: {exc}") from exc
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"malformed profiles file {path}: {exc}") from exc
    parse_profiles(document, str(path))
    assert isinstance(document, dict)  # parse_profiles checked it
    document.setdefault("profiles", {})
    return document


def write_document(path: Path, document: dict[str, Any]) -> None:
    """Replace the profiles file atomically (0600 in a 0700 directory).

    :raises ProfileError: the file cannot be written.
    """
    parse_profiles(document, str(path))  # never write what jobs could not read
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".profiles-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(document, f, indent=2, sort_keys=True)
                f.write("\n")
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise ProfileError(f"cannot write profiles file {path}: {exc}") from exc


# --------------------------------------------------------------------------- command


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``profile`` command group."""
    p = sub.add_parser("profile", help="named sets of settings (~/.kinetic/profiles.json)")
    actions = p.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="create (or with --force replace) a profile")
    create.add_argument("name")
    for field in PROFILE_FIELDS:
        flag = "--" + field.replace("_", "-")
        if field == "builder":
            create.add_argument(flag, dest=f"p_{field}", choices=("docker", "cloudbuild"))
        elif field == "build_install":
            create.add_argument(flag, dest=f"p_{field}", choices=("index", "wheels"))
        else:
            create.add_argument(flag, dest=f"p_{field}", metavar=field.upper())
    create.add_argument("--use", action="store_true", help="make it the current profile")
    create.add_argument("--force", action="store_true", help="replace a profile of that name")
    ls = actions.add_parser("ls", help="list the profiles")
    ls.add_argument("--json", action="store_true", help="one JSON object on stdout")
    actions.add_parser("use", help="make a profile the current one").add_argument("name")
    show = actions.add_parser("show", help="one profile's fields (default: the active one)")
    show.add_argument("name", nargs="?")
    show.add_argument("--json", action="store_true", help="one JSON object on stdout")
    rm = actions.add_parser("rm", help="delete a profile")
    rm.add_argument("name")
    rm.add_argument("-y", "--yes", action="store_true", help="do not ask first")
    actions.add_parser("unset", help="make no profile the current one")


def run(ns: argparse.Namespace) -> int:
    """Run a ``profile`` command; return the exit status."""
    from kinetic._settings import profiles_path

    path = profiles_path()
    try:
        document = read_document(path)
        if ns.action == "create":
            fields = {f: getattr(ns, f"p_{f}") for f in PROFILE_FIELDS if getattr(ns, f"p_{f}")}
            document = with_profile(document, ns.name, fields, replace=ns.force)
            if ns.use:
                document = with_current(document, ns.name)
            write_document(path, document)
            hint = "" if ns.use else f" (activate it: kinetic profile use {ns.name})"
            print(f"created profile {ns.name} in {path}{hint}")
            return EXIT_OK
        if ns.action == "use":
            write_document(path, with_current(document, ns.name))
            print(f"current profile: {ns.name}")
            return EXIT_OK
        if ns.action == "rm":
            remaining = without_profile(document, ns.name)
            if not ns.yes and not _confirmed(f"remove profile {ns.name} from {path}?"):
                print("kinetic: nothing removed", file=sys.stderr)
                return EXIT_FAILED
            write_document(path, remaining)
            print(f"removed profile {ns.name}")
            return EXIT_OK
        if ns.action == "unset":
            was = document.get("current")
            write_document(path, without_current(document))
            print(f"no current profile (was: {was})" if was else "no current profile")
            if os.environ.get("KINETIC_PROFILE"):
                print(
                    f"kinetic: KINETIC_PROFILE={os.environ['KINETIC_PROFILE']} still selects "
                    "a profile in this shell",
                    file=sys.stderr,
                )
            return EXIT_OK
        if ns.action == "ls":
            return _list(document, path, ns.json)
        return _show(document, path, ns.name, ns.json)
    except KineticError as exc:
        return report_error(exc)


def _active(document: dict[str, Any]) -> str | None:
    return os.environ.get("KINETIC_PROFILE") or document.get("current")


def _list(document: dict[str, Any], path: Path, as_json: bool) -> int:
    active = _active(document)
    profiles = document["profiles"]
    if as_json:
        emit_json({"file": str(path), "active": active, "profiles": profiles})
        return EXIT_OK
    rows = [
        ["*" if name == active else "", name, *(fields.get(f) for f in PROFILE_FIELDS)]
        for name, fields in sorted(profiles.items())
    ]
    table(("active", "name", *PROFILE_FIELDS), rows, title=f"profiles in {path}")
    return EXIT_OK


def _show(document: dict[str, Any], path: Path, name: str | None, as_json: bool) -> int:
    wanted = name or _active(document)
    if wanted is None:
        raise ProfileNotFoundError(f"no active profile in {path} (kinetic profile use NAME)")
    if wanted not in document["profiles"]:
        raise ProfileNotFoundError(f"no profile {wanted!r} in {path}")
    fields = document["profiles"][wanted]
    if as_json:
        emit_json({"name": wanted, "active": wanted == _active(document), **fields})
        return EXIT_OK
    table(("field", "value"), sorted(fields.items()), title=f"profile {wanted}")
    return EXIT_OK
