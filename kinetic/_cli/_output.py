"""What every command shares: exit codes, error reporting, tables and JSON.

Exit codes (documented in ``docs/cli.md``)::

    0    success (``doctor``: no check failed)
    1    the job or batch failed, a ``doctor`` check failed, or an operation failed
    2    bad usage or configuration (arguments, settings, accelerator names, profiles)
    3    not found (no such job, batch or profile)
    4    timed out (``--timeout``)
    130  interrupted (Ctrl-C); a job being waited for keeps running

Human output goes through :func:`table`: a rich table on a terminal, plain
space-aligned columns (one header line) when stdout is a pipe or a file. ``--json``
output goes through :func:`emit_json`: one JSON document on stdout, nothing else.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from kinetic._exceptions import ConfigError, JobTimeoutError, KineticError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_TIMEOUT = 4
EXIT_INTERRUPTED = 130


def exit_code_for(exc: BaseException) -> int:
    """The exit status that tells a script what kind of error ``exc`` is. Pure."""
    if isinstance(exc, JobTimeoutError):
        return EXIT_TIMEOUT
    if isinstance(exc, KineticError) and isinstance(exc, LookupError):
        return EXIT_NOT_FOUND
    if isinstance(exc, ConfigError):
        return EXIT_USAGE
    return EXIT_FAILED


def report_error(exc: BaseException) -> int:
    """Print ``exc`` on stderr as ``kinetic: message``; return its exit status."""
    print(f"kinetic: {exc}", file=sys.stderr)
    return exit_code_for(exc)


def emit_json(document: Any) -> None:
    """Print one JSON document on stdout (values JSON cannot hold become their repr)."""
    json.dump(document, sys.stdout, indent=1, default=repr)
    sys.stdout.write("\n")


def cell(value: Any) -> str:
    """A value as a table cell: ``-`` for None, ``yes``/``no`` for booleans."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def plain_lines(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """Rows as space-aligned text lines under an upper-case header. Pure."""
    header = [c.upper() for c in columns]
    texts = [[cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in [header, *texts]) for i in range(len(columns))]
    return [
        "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *texts]
    ]


def table(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    title: str | None = None,
    styles: Sequence[str | None] | None = None,
) -> None:
    """Print rows: a rich table on a terminal, plain aligned columns otherwise.

    :param styles: an optional rich style per row (e.g. ``"red"`` for a failure).
    """
    if not sys.stdout.isatty():
        for line in plain_lines(columns, rows):
            print(line)
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for column in columns:
        t.add_column(column, overflow="fold")
    for i, row in enumerate(rows):
        t.add_row(*(cell(v) for v in row), style=styles[i] if styles else None)
    Console().print(t)
