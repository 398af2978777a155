"""How each input of ``run_async_map`` becomes a call, and how inputs are chunked. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kinetic._core.retries import Retries, retries_record
from kinetic._exceptions import ConfigError
from runner import protocol
from runner.protocol import INPUT_MODES

__all__ = [
    "INPUT_MODES",
    "MapOptions",
    "check_input_mode",
    "check_map_options",
    "chunk_size",
    "to_call",
]


def to_call(item: Any, mode: str, index: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The ``(args, kwargs)`` that input ``index`` is called with.

    ``auto``: a dict whose keys are all identifiers becomes ``**kwargs``, a list or tuple
    becomes ``*args``, anything else one positional argument. ``single``: always one
    positional argument. ``args`` / ``kwargs``: the item must be a list/tuple / a dict
    with string keys.

    :raises ConfigError: naming the input when it does not fit the mode.
    """
    if mode == "single":
        return (item,), {}
    if mode == "args":
        if not isinstance(item, (list, tuple)):
            raise ConfigError(
                f"input {index}: input_mode='args' needs a list or tuple, got {type(item).__name__}"
            )
        return tuple(item), {}
    if mode == "kwargs":
        if not isinstance(item, Mapping) or not all(isinstance(k, str) for k in item):
            raise ConfigError(f"input {index}: input_mode='kwargs' needs a dict with string keys")
        return (), dict(item)
    if (
        isinstance(item, Mapping)
        and item
        and all(isinstance(k, str) and k.isidentifier() for k in item)
    ):
        return (), dict(item)
    if isinstance(item, (list, tuple)):
        return tuple(item), {}
    return (item,), {}


def check_input_mode(input_mode: object) -> protocol.InputMode:
    """``input_mode`` if it is one of :data:`INPUT_MODES`.

    :raises ConfigError: for anything else.
    """
    for mode in INPUT_MODES:
        if input_mode == mode:
            return mode
    raise ConfigError(f"input_mode must be one of {', '.join(INPUT_MODES)}; got {input_mode!r}")


def check_map_options(
    *,
    input_mode: object,
    max_concurrent: object,
    retries: object,
    fail_fast: object,
    cancel_running_on_fail: object,
    name: object,
    tags: object,
    reuse_process: object = False,
) -> None:
    """Validate ``run_async_map`` options before anything is written.

    :raises ConfigError: naming the offending option.
    """
    check_input_mode(input_mode)
    if max_concurrent is not None and (
        not isinstance(max_concurrent, int)
        or isinstance(max_concurrent, bool)
        or max_concurrent < 1
    ):
        raise ConfigError(
            f"max_concurrent must be a positive integer or None, got {max_concurrent!r}"
        )
    if not isinstance(retries, Retries) and (
        not isinstance(retries, int) or isinstance(retries, bool) or retries < 0
    ):
        raise ConfigError(
            f"retries must be a non-negative integer or a kinetic.Retries, got {retries!r}"
        )
    for label, flag in (
        ("fail_fast", fail_fast),
        ("cancel_running_on_fail", cancel_running_on_fail),
        ("reuse_process", reuse_process),
    ):
        if not isinstance(flag, bool):
            raise ConfigError(f"{label} must be True or False, got {flag!r}")
    if cancel_running_on_fail and not fail_fast:
        # Not silently ignored: running inputs are ended only when fail_fast stops the batch.
        raise ConfigError(
            "cancel_running_on_fail=True needs fail_fast=True (running inputs are ended "
            "when fail_fast stops the batch); pass both, or neither"
        )
    if name is not None and not isinstance(name, str):
        raise ConfigError(f"name must be a string, got {type(name).__name__}")
    if tags is not None and (
        not isinstance(tags, Mapping)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in tags.items())
    ):
        raise ConfigError("tags must be a dict of strings to strings")


@dataclass(frozen=True)
class MapOptions:
    """``run_async_map``'s options, validated once (at construction) and passed whole.

    :ivar input_mode: how each input becomes a call (:func:`to_call`).
    :ivar max_concurrent: inputs running at once; None: the backend's default.
    :ivar retries: extra attempts of a failed input: a plain count (every failure
        retried at once), or a :class:`~kinetic._core.retries.Retries` (its delays and
        exception types); a ``Retries(0)`` is made ``0``.
    :ivar fail_fast: stop launching inputs after the first final failure.
    :ivar cancel_running_on_fail: with ``fail_fast``, also end the running inputs.
    :ivar name: a label kept in the manifest.
    :ivar tags: labels kept in the manifest (a read-only copy of what was given).
    :ivar reuse_process: GKE pools: run inputs one after another in each worker's own
        process instead of a fresh fork per input (faster for short inputs; no
        isolation between the inputs a worker runs). Kept in the manifest's ``gke``.
    :raises ConfigError: naming the first invalid option (:func:`check_map_options`).
    """

    input_mode: protocol.InputMode = "auto"
    max_concurrent: int | None = None
    retries: int | Retries = 0
    fail_fast: bool = False
    cancel_running_on_fail: bool = False
    name: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict, hash=False)
    reuse_process: bool = False

    def __post_init__(self) -> None:
        check_map_options(
            input_mode=self.input_mode,
            max_concurrent=self.max_concurrent,
            retries=self.retries,
            fail_fast=self.fail_fast,
            cancel_running_on_fail=self.cancel_running_on_fail,
            name=self.name,
            tags=self.tags,
            reuse_process=self.reuse_process,
        )
        # Frozen all the way down: the caller's dict may change after submission.
        object.__setattr__(self, "tags", MappingProxyType(dict(self.tags or {})))
        if isinstance(self.retries, Retries) and not self.retries.count:
            object.__setattr__(self, "retries", 0)

    def record(self, default_concurrency: int) -> protocol.MapOptionsRecord:
        """The manifest's ``options``, with ``max_concurrent`` resolved against the
        backend's ``default_concurrency``. ``retries`` is always the count (what every
        reader takes); a :class:`Retries` adds ``retry_rule``."""
        retries = self.retries
        record: protocol.MapOptionsRecord = {
            "input_mode": self.input_mode,
            "max_concurrent": (
                self.max_concurrent if self.max_concurrent is not None else default_concurrency
            ),
            "retries": retries.count if isinstance(retries, Retries) else retries,
            "fail_fast": self.fail_fast,
            "cancel_running_on_fail": self.cancel_running_on_fail,
        }
        if isinstance(retries, Retries):
            record["retry_rule"] = retries_record(retries)
        return record


def chunk_size(n_inputs: int, *, target_chunks: int = 64, max_size: int = 2048) -> int:
    """Inputs per stored chunk: few objects for many tiny inputs, bounded in size."""
    return max(1, min(max_size, -(-n_inputs // target_chunks)))
