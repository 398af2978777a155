"""A process's ``/proc/PID/stat``, read one way (runner, launcher, local backend).

The start time (clock ticks since boot) is what tells a process from a later one that
reused its pid: whoever records a pid to signal later records it too.
"""

from __future__ import annotations

from pathlib import Path

# Field positions counted after the command name: state is 0, pgid 2, starttime 19.
STATE, PGID, START_TICKS = 0, 2, 19


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name, or None if it is gone
    (or not ours to read)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ProcessLookupError):
        return None
    # The command name may hold spaces and parentheses: split after the last ')'.
    return raw[raw.rindex(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None if it is gone."""
    fields = stat_fields(pid)
    return int(fields[START_TICKS]) if fields else None
