"""Job and batch identifiers: generation and validation."""

from __future__ import annotations

import re
import secrets

from kinetic._exceptions import ConfigError

_JOB_ID = re.compile(r"^job-[0-9a-f]{8,32}$")
_GROUP_ID = re.compile(r"^grp-[0-9a-f]{8,32}$")


def new_job_id() -> str:
    """A fresh job id, ``job-`` and 8 hex digits as the original."""
    return f"job-{secrets.token_hex(4)}"


def new_group_id() -> str:
    """A fresh batch id, ``grp-`` and 12 hex digits."""
    return f"grp-{secrets.token_hex(6)}"


def check_job_id(job_id: object) -> str:
    """Return ``job_id`` if it is a well-formed job id.

    :raises ConfigError: for anything else, notably ids shaped like paths (``../x``).
    """
    if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id):
        raise ConfigError(f"invalid job id {job_id!r}: expected 'job-' followed by hex digits")
    return job_id


def check_group_id(group_id: object) -> str:
    """Return ``group_id`` if it is a well-formed batch id.

    :raises ConfigError: for anything else.
    """
    if not isinstance(group_id, str) or not _GROUP_ID.fullmatch(group_id):
        raise ConfigError(f"invalid batch id {group_id!r}: expected 'grp-' followed by hex digits")
    return group_id
