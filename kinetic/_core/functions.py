"""What may be decorated, and how to name a call's arguments in errors. Pure."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kinetic._exceptions import InvalidFunctionError


def check_function(obj: object) -> Callable[..., Any]:
    """Return ``obj`` if it can run as a job.

    :raises InvalidFunctionError: for non-callables, ``classmethod``/``staticmethod``
        objects (decorate the function first, then wrap it), and ``functools.lru_cache``
        wrappers (their cache lives in this process and cannot travel).
    """
    if isinstance(obj, (classmethod, staticmethod)):
        kind = type(obj).__name__
        raise InvalidFunctionError(
            f"cannot run a {kind} as a job: put @kinetic.run below @{kind} "
            f"(so it wraps the plain function)"
        )
    if isinstance(obj, functools._lru_cache_wrapper):
        raise InvalidFunctionError(
            f"cannot run the functools.lru_cache wrapper of {obj.__wrapped__.__qualname__!r} "
            "as a job: its cache lives in this process; decorate the undecorated function"
        )
    if not callable(obj):
        raise InvalidFunctionError(f"@kinetic.run needs a callable, got {type(obj).__name__}")
    return obj


def name_arguments(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> Iterator[tuple[str, Any]]:
    """Yield ``(description, value)`` for each argument of a call, for error messages."""
    try:
        bound = inspect.signature(fn).bind_partial(*args, **kwargs).arguments
    except (TypeError, ValueError):
        bound = None
    if bound is not None:
        for name, value in bound.items():
            yield f"argument {name!r}", value
        return
    for i, value in enumerate(args):
        yield f"positional argument {i}", value
    for name, value in kwargs.items():
        yield f"keyword argument {name!r}", value
