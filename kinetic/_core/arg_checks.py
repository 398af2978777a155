"""Type checks of the decorator's arguments, each error naming its argument. Pure.

Without them a truthy string switches a feature on (``spot="false"`` asks for spot VMs,
``debug="no"`` waits for a debugger) and an int reaches a manifest as an int.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kinetic._exceptions import ConfigError

STRING_ARGS = (
    "accelerator",
    "container_image",
    "base_image_repo",
    "zone",
    "project",
    "cluster",
    "backend",
    "namespace",
    "output_dir",
)
FLAG_ARGS = ("spot", "debug")


def _kind(value: object) -> str:
    return f"{type(value).__name__} {value!r}"


def check_flag(name: str, value: object) -> None:
    """``value`` must be a bool (a string such as ``"false"`` would count as true).

    :raises ConfigError: naming ``name``.
    """
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, got {_kind(value)}")


def check_optional_string(name: str, value: object) -> None:
    """``value`` must be None or a string.

    :raises ConfigError: naming ``name``.
    """
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{name} must be a string or None, got {_kind(value)}")


def check_run_args(args: Mapping[str, Any]) -> None:
    """Check the types of ``@kinetic.run``'s arguments, given by name.

    :raises ConfigError: naming the first argument of the wrong type.
    """
    for name in STRING_ARGS:
        check_optional_string(name, args.get(name))
    for name in FLAG_ARGS:
        check_flag(name, args.get(name, False))
    names = args.get("capture_env_vars")
    if names is not None:
        if isinstance(names, str):
            raise ConfigError(
                f"capture_env_vars must be a list of names or PREFIX* patterns, e.g. "
                f"[{names!r}], not the string {names!r}"
            )
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            raise ConfigError(
                f"capture_env_vars must be a list of names or PREFIX* patterns, got {_kind(names)}"
            )


def check_timeout(name: str, value: object, *, optional: bool = True) -> None:
    """``value`` must be a non-negative number of seconds (or None where ``optional``).

    :raises ConfigError: naming ``name``: a negative timeout would end the wait at once,
        and a string would fail deep inside the wait.
    """
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        what = "a non-negative number of seconds" + (" or None" if optional else "")
        raise ConfigError(f"{name} must be {what}, got {_kind(value)}")


def check_run_time_limit(value: object) -> float | None:
    """``run(timeout=)``: None, or a positive number of seconds (as a float).

    :raises ConfigError: naming ``timeout``; a limit of 0 would end every job at once.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(
            f"timeout must be a positive number of seconds (the job's run-time limit) "
            f"or None, got {_kind(value)}"
        )
    return float(value)


def check_count(name: str, value: object) -> None:
    """``value`` must be a non-negative integer (a count of lines, say).

    :raises ConfigError: naming ``name``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name} must be a non-negative integer, got {_kind(value)}")
