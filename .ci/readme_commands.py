#!/usr/bin/env python3
"""Print the README's set-up commands, verbatim, as one shell script.

CI runs what a new user reads, not a copy that can drift: the section headed
``## Set-up`` holds the virtual-environment line (inline code starting with
``python3 -m venv``) and one ``sh`` block per command, in the order a user runs them.
This prints them in that order, each preceded by an ``echo`` of itself. It fails
(exit status 1, with the reason) when the section, the venv line or the blocks are
missing, so a README that loses them fails CI instead of running nothing.

Usage: ``python3 .ci/readme_commands.py README.md``. Stdlib only.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

_SECTION = re.compile(r"^## Set-up\b.*?(?=^## |\Z)", re.MULTILINE | re.DOTALL)
_VENV = re.compile(r"`(python3 -m venv [^`]+)`")
_BLOCK = re.compile(r"^[ \t]*```sh[ \t]*\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)


def setup_commands(readme: str) -> list[str]:
    """The venv line, then every ``sh`` block of the set-up section (dedented)."""
    section = _SECTION.search(readme)
    if section is None:
        raise ValueError("README has no '## Set-up' section")
    text = section.group(0)
    venv = _VENV.search(text)
    if venv is None:
        raise ValueError("README's set-up section names no `python3 -m venv ...` line")
    blocks = [_dedent(b) for b in _BLOCK.findall(text)]
    if not blocks:
        raise ValueError("README's set-up section has no ```sh block")
    return [venv.group(1), *blocks]


def _dedent(block: str) -> str:
    lines = block.splitlines()
    indent = min((len(line) - len(line.lstrip()) for line in lines if line.strip()), default=0)
    return "\n".join(line[indent:] for line in lines).strip()


def main(argv: list[str]) -> int:
    path = Path(argv[1] if len(argv) > 1 else "README.md")
    try:
        commands = setup_commands(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"readme_commands: {path}: {exc}", file=sys.stderr)
        return 1
    for command in commands:
        print(f"echo {shlex.quote('+ ' + command)}")
        print(command)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
