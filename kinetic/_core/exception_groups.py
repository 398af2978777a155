"""Task groups raise exception groups; callers of Kinetic get one Kinetic error.

The one way to unwrap them: enter :func:`one_error` around the task group, so that
``except kinetic.DataError`` (say) catches what a child task (or the group's own body)
raised::

    with one_error():
        async with anyio.create_task_group() as tg:
            ...
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


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


@contextmanager
def one_error() -> Iterator[None]:
    """Re-raise an exception group raised inside as its first ordinary exception.

    A group of nothing but ``BaseException``s (a ``KeyboardInterrupt``, say) is left as
    it is.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        error = first_error(group)
        if error is group:
            raise
        raise error from error.__cause__  # its own cause kept; the group not shown
