"""Kinetic's messages: records on the ``kinetic`` logger, and where they go by default.

Theory of operation
-------------------
Every message of the library (the local-backend notice, notes on requirement lines, image
build steps, warnings) is a record on a logger under ``kinetic``: each module logs on
``logging.getLogger(__name__)`` and prints nothing. What reaches a person is up to the
application, as for any library that logs:

- **An application that configures logging** (a handler on the root logger, or on
  ``kinetic``) receives the records through its own handlers and formats them; Kinetic
  writes nothing of its own then, so nothing appears twice.
- **A plain script that configures nothing** sees what it saw when these were prints:
  :class:`DefaultHandler`, on the ``kinetic`` logger, writes ``kinetic: ...`` lines to
  ``sys.stderr``, but only for a record no other handler on its way to the root would
  receive. It stands in for :data:`logging.lastResort` (which the standard library keeps
  at ``WARNING``) with Kinetic's own format and level, and steps aside the moment the
  application adds a handler anywhere on the record's way up, before or after ``import
  kinetic`` (httpx and urllib3 leave a script silent instead; Kinetic's notices are
  worth a line).

The level: ``kinetic``'s own, so that its ``INFO`` notices pass whatever the root's
level. :func:`install` sets ``INFO`` unless the application set one before importing
Kinetic. ``KINETIC_LOG_LEVEL`` (``DEBUG``, ``INFO``, ``WARNING`` or ``ERROR``, in any
case) or ``KINETIC_QUIET`` (any value: ``WARNING``), when set, decide it instead: read at
import and again at each submission (:func:`apply_env`), so a script that sets
``os.environ`` after ``import kinetic`` is obeyed too. Unset, they leave the level as the
application set it. A value that names no level is said once, as a warning, and ignored:
a misspelt logging variable must not fail ``import kinetic`` or the job.

The runner (``runner/``) keeps its prints: they are the job's output, not messages of
this library.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Mapping

LOGGER_NAME = "kinetic"
"""The logger every module of Kinetic logs under (``kinetic.<module>``)."""

LEVELS: Mapping[str, int] = {
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
}
"""What ``KINETIC_LOG_LEVEL`` accepts (in any case)."""

DEFAULT_LEVEL = logging.INFO
"""The ``kinetic`` logger's level when nothing sets one: its notices are ``INFO``."""

HANDLER_NAME = "kinetic.default"
"""The name of :class:`DefaultHandler` on the ``kinetic`` logger."""

log = logging.getLogger(__name__)

_bad_values: set[str] = set()
_bad_lock = threading.Lock()


class DefaultHandler(logging.Handler):
    """``kinetic: ...`` lines on ``sys.stderr`` (looked up at each record, as
    :data:`logging.lastResort` does) for the records no other handler receives."""

    def __init__(self) -> None:
        super().__init__()
        self.set_name(HANDLER_NAME)
        self.setFormatter(LineFormatter())

    def handle(self, record: logging.LogRecord) -> bool:
        if heard_elsewhere(record, self):
            return False
        return super().handle(record)

    def emit(self, record: logging.LogRecord) -> None:
        stream = sys.stderr
        if stream is None:  # pythonw, or a daemon that closed it: nowhere to say it
            return
        try:
            stream.write(self.format(record) + "\n")
            stream.flush()
        except RecursionError:
            raise
        except Exception:  # noqa: BLE001 - logging's own contract: report, never raise
            self.handleError(record)


class LineFormatter(logging.Formatter):
    """``kinetic: message`` for ``INFO``; ``kinetic: warning: message``, ``kinetic:
    error: ...`` and ``kinetic: debug: ...`` for the others (the prints' old format)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return f"kinetic: {level_label(record.levelno)}{record.message}"


def level_label(levelno: int) -> str:
    """What follows ``kinetic: `` for a record of ``levelno``. Pure."""
    if levelno >= logging.ERROR:
        return "error: "
    if levelno >= logging.WARNING:
        return "warning: "
    if levelno >= logging.INFO:
        return ""
    return "debug: "


def heard_elsewhere(record: logging.LogRecord, handler: logging.Handler) -> bool:
    """Whether a handler other than ``handler`` is on the record's way from its logger to
    the root (as :meth:`logging.Logger.callHandlers` walks it: up while ``propagate``).
    Whatever its level, like the count that decides on :data:`logging.lastResort`."""
    logger: logging.Logger | None = logging.getLogger(record.name)
    while logger is not None:
        if any(other is not handler for other in logger.handlers):
            return True
        if not logger.propagate:
            return False
        logger = logger.parent
    return False


def level_from_env(env: Mapping[str, str]) -> tuple[int | None, str | None]:
    """The level ``env`` asks for (``None``: it asks for none) and, when
    ``KINETIC_LOG_LEVEL`` names no level, that value. ``KINETIC_LOG_LEVEL`` wins over
    ``KINETIC_QUIET``. Pure."""
    raw = env.get("KINETIC_LOG_LEVEL", "").strip()
    bad = None
    if raw:
        level = LEVELS.get(raw.upper())
        if level is not None:
            return level, None
        bad = raw
    if env.get("KINETIC_QUIET"):
        return logging.WARNING, bad
    return None, bad


def apply_env(env: Mapping[str, str] | None = None) -> None:
    """Set the ``kinetic`` logger's level from ``KINETIC_LOG_LEVEL`` / ``KINETIC_QUIET``
    when either is set (:func:`level_from_env`); leave it alone when neither is. A value
    that names no level is said once per value, as a warning."""
    level, bad = level_from_env(os.environ if env is None else env)
    if bad is not None:
        with _bad_lock:
            new = bad not in _bad_values
            _bad_values.add(bad)
        if new:
            log.warning(
                "KINETIC_LOG_LEVEL=%r is not a level; it is ignored (valid, in any case: %s)",
                bad,
                ", ".join(LEVELS),
            )
    logger = logging.getLogger(LOGGER_NAME)
    if level is not None and logger.level != level:
        logger.setLevel(level)


def install() -> None:
    """Give the ``kinetic`` logger :class:`DefaultHandler` (once) and its level: run by
    ``import kinetic``."""
    logger = logging.getLogger(LOGGER_NAME)
    if not any(handler.get_name() == HANDLER_NAME for handler in logger.handlers):
        logger.addHandler(DefaultHandler())
    if logger.level == logging.NOTSET:  # the application's own choice, made earlier, stands
        logger.setLevel(DEFAULT_LEVEL)
    apply_env()
