"""``kinetic context``: what would travel with a job started from a path, and its size.

    kinetic context [PATH] [--json]

PATH (default: the current directory) is a file or directory of the project; the
package root is found from it as for a job (``KINETIC_PACKAGE_ROOT`` wins). Prints each
file that travels with its size, then the totals and the largest directories; with
``--json`` one object: ``root``, ``git_work_tree`` (or ``null``: ``.gitignore`` files
are then not read), ``ignore_files``, ``files`` (``path``, ``bytes``), ``file_count``,
``total_bytes`` and ``largest_dirs`` (``path``, ``bytes``, ``files``). Lists only: no
archive is built, nothing is read but the ignore files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``context`` command."""
    p = sub.add_parser(
        "context",
        help="list what travels with a job started from PATH, and its size",
        description="List the files of the package root that travel with a job.",
    )
    p.add_argument("path", nargs="?", default=".", help="a path in the project (default: .)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")


def run(ns: argparse.Namespace) -> int:
    """Run ``context``; return the exit status."""
    from kinetic._engine.context_files import largest_dirs, root_rules, scan
    from kinetic._engine.packaging import find_package_root, human_bytes
    from kinetic._exceptions import KineticError

    try:
        start = Path(ns.path).expanduser().resolve()
        if not start.exists():
            print(f"kinetic: {ns.path}: no such file or directory", file=sys.stderr)
            return 2
        root = find_package_root(start if start.is_dir() else start.parent)
        walk = scan(root, exclude=_kinetic_paths(ns), use_cache=False)
        rules = root_rules(walk.root)
    except KineticError as exc:
        print(f"kinetic: {exc}", file=sys.stderr)
        return 1
    sizes = list(walk.sizes())
    top = largest_dirs(sizes, 5)
    secrets_left_out, secrets_kept = walk.secrets()
    if ns.json:
        layers = [layer.source for layer in rules.rules.git]
        if rules.work_tree is not None:  # and those inside the root, as the walk met them
            layers += [rel for rel, _ in sizes if rel.rpartition("/")[2] == ".gitignore"]
        if rules.rules.kinetic is not None:
            layers.append(rules.rules.kinetic.source)
        out = {
            "root": str(walk.root),
            "git_work_tree": str(rules.work_tree) if rules.work_tree else None,
            "ignore_files": layers,
            "files": [{"path": rel, "bytes": size} for rel, size in sizes],
            "file_count": walk.file_count,
            "total_bytes": walk.total_bytes,
            "largest_dirs": [{"path": p, "bytes": b, "files": n} for p, b, n in top],
            "secrets_left_out": secrets_left_out,
            "secrets_kept": secrets_kept,
        }
        json.dump(out, sys.stdout, indent=1)
        print()
        return 0
    for rel, size in sizes:
        print(f"{human_bytes(size):>10}  {rel}")
    where = (
        f"git work tree {rules.work_tree}: .gitignore rules apply"
        if rules.work_tree
        else "not in a git work tree: only .kineticignore and the defaults apply"
    )
    print(f"\npackage root {walk.root} ({where})")
    print(f"{walk.file_count} files, {human_bytes(walk.total_bytes)} travel with each job")
    for path, b, n in top:
        print(f"{human_bytes(b):>10}  {path} ({n} files)")
    if secrets_left_out:
        print(f"left out, as they look like secrets: {', '.join(secrets_left_out)}")
    if secrets_kept:
        print(f"look like secrets, shipped as .kineticignore says: {', '.join(secrets_kept)}")
    return 0


def _kinetic_paths(ns: argparse.Namespace) -> tuple[Path, ...]:
    """Kinetic's local root, left out as a job leaves it out."""
    from kinetic._exceptions import KineticError
    from kinetic._settings import load_settings

    try:
        settings = load_settings(backend=ns.backend, project=ns.project, cluster=ns.cluster)
    except KineticError:
        return ()
    return (Path(settings.local_root),)
