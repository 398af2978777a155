"""Task groups raise exception groups; callers of Kinetic get one Kinetic error."""

from __future__ import annotations


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first ordinary exception in ``group`` (nested groups flattened), else the group."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            inner = first_error(exc)
            if not isinstance(inner, BaseExceptionGroup):
                return inner
        elif isinstance(exc, Exception):
            return exc
    return group
