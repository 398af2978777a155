"""Kinetic's messages are records on the ``kinetic`` logger (kinetic/_log.py): a script
that configures no logging sees ``kinetic: ...`` lines on stderr, an application that
configures logging gets the records through its own handlers and nothing twice, and
``KINETIC_LOG_LEVEL`` / ``KINETIC_QUIET`` set the level. Process-level behaviour runs in
fresh interpreters (pytest's own handlers are on the root logger here)."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator

import pytest

from kinetic import _log


@pytest.fixture
def kinetic_level() -> Iterator[logging.Logger]:
    """The ``kinetic`` logger, its level restored after the test."""
    logger = logging.getLogger(_log.LOGGER_NAME)
    level = logger.level
    yield logger
    logger.setLevel(level)


@pytest.mark.parametrize(
    ("env", "level"),
    [
        ({}, None),
        ({"KINETIC_LOG_LEVEL": "debug"}, logging.DEBUG),
        ({"KINETIC_LOG_LEVEL": " Info "}, logging.INFO),
        ({"KINETIC_LOG_LEVEL": "WARNING"}, logging.WARNING),
        ({"KINETIC_LOG_LEVEL": "error"}, logging.ERROR),
        ({"KINETIC_QUIET": "1"}, logging.WARNING),
        ({"KINETIC_QUIET": ""}, None),
        ({"KINETIC_QUIET": "1", "KINETIC_LOG_LEVEL": "DEBUG"}, logging.DEBUG),
        ({"KINETIC_LOG_LEVEL": ""}, None),
    ],
)
def test_the_level_the_environment_asks_for(env: dict[str, str], level: int | None) -> None:
    assert _log.level_from_env(env) == (level, None)


def test_a_value_that_names_no_level_is_reported_and_quiet_still_counts() -> None:
    assert _log.level_from_env({"KINETIC_LOG_LEVEL": "loud"}) == (None, "loud")
    assert _log.level_from_env({"KINETIC_LOG_LEVEL": "warn", "KINETIC_QUIET": "1"}) == (
        logging.WARNING,
        "warn",
    )


def test_apply_env_sets_the_level_only_when_asked(kinetic_level: logging.Logger) -> None:
    kinetic_level.setLevel(logging.INFO)
    _log.apply_env({})
    assert kinetic_level.level == logging.INFO  # unset: the application's level stands
    _log.apply_env({"KINETIC_LOG_LEVEL": "error"})
    assert kinetic_level.level == logging.ERROR
    _log.apply_env({"KINETIC_QUIET": "yes"})
    assert kinetic_level.level == logging.WARNING


def test_a_bad_level_is_said_once_and_changes_nothing(
    kinetic_level: logging.Logger,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_log, "_bad_values", set())
    kinetic_level.setLevel(logging.INFO)
    for _ in range(2):
        _log.apply_env({"KINETIC_LOG_LEVEL": "verbose"})
    said = [r for r in caplog.records if "KINETIC_LOG_LEVEL" in r.getMessage()]
    assert len(said) == 1
    assert said[0].levelno == logging.WARNING
    assert said[0].name == "kinetic._log"
    assert "'verbose'" in said[0].getMessage()
    assert "DEBUG, INFO, WARNING, ERROR" in said[0].getMessage()
    assert kinetic_level.level == logging.INFO


@pytest.mark.parametrize(
    ("level", "line"),
    [
        (logging.DEBUG, "kinetic: debug: hi"),
        (logging.INFO, "kinetic: hi"),
        (logging.WARNING, "kinetic: warning: hi"),
        (logging.ERROR, "kinetic: error: hi"),
        (logging.CRITICAL, "kinetic: error: hi"),
    ],
)
def test_the_default_lines(level: int, line: str) -> None:
    record = logging.LogRecord("kinetic.x", level, __file__, 1, "hi", None, None)
    assert _log.LineFormatter().format(record) == line


@contextlib.contextmanager
def detached() -> Iterator[logging.Logger]:
    """A logger tree of its own, with a :class:`DefaultHandler` at its top as on
    ``kinetic``, and ``propagate`` off: pytest's handlers on the root are not on its way.
    Made in the test's body (pytest also gives its handlers to the loggers that do not
    propagate when a test phase starts)."""
    top = logging.getLogger(f"kinetic_test_{uuid.uuid4().hex[:8]}")
    top.addHandler(_log.DefaultHandler())
    top.propagate = False
    top.setLevel(logging.DEBUG)
    try:
        yield top
    finally:
        for each in list(top.handlers):
            top.removeHandler(each)


def test_the_default_handler_speaks_when_no_other_handler_hears(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with detached() as top:
        top.getChild("child").info("the notice")
        top.getChild("child").debug("a detail")
    assert capsys.readouterr().err == "kinetic: the notice\nkinetic: debug: a detail\n"


@pytest.mark.parametrize("where", ["top", "child"])
def test_the_default_handler_steps_aside_for_any_other_handler(
    where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    heard: list[str] = []
    host = logging.Handler()
    host.emit = lambda record: heard.append(record.getMessage())  # type: ignore[method-assign]
    with detached() as top:
        child = top.getChild("child")
        (top if where == "top" else child).addHandler(host)
        child.warning("careful")
        child.removeHandler(host)
    assert heard == ["careful"]
    assert capsys.readouterr().err == ""  # not said twice


def test_the_default_handler_writes_to_the_current_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with detached() as top:
        top.info("one")
        assert capsys.readouterr().err == "kinetic: one\n"
        top.info("two")  # capsys swapped sys.stderr again: the handler follows it
        assert capsys.readouterr().err == "kinetic: two\n"


def test_install_keeps_one_handler_and_the_applications_level(
    kinetic_level: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KINETIC_QUIET")  # set for every test (tests/fix_env.py): it would decide
    kinetic_level.setLevel(logging.ERROR)
    _log.install()
    _log.install()
    named = [h for h in kinetic_level.handlers if h.get_name() == _log.HANDLER_NAME]
    assert len(named) == 1
    assert kinetic_level.level == logging.ERROR


def python(script: str, **env: str | None) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a fresh interpreter with ``env`` changed (``None``: unset)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KINETIC_")}
    for name, value in env.items():
        if value is not None:
            environ[name] = value
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
        check=True,
    )


_SAY = """
log = logging.getLogger("kinetic._engine.something")
log.debug("a detail")
log.info("a notice")
log.warning("a warning")
"""


def test_a_script_that_configures_nothing_sees_the_lines_on_stderr() -> None:
    out = python("import logging\nimport kinetic\n" + _SAY)
    assert out.stderr == "kinetic: a notice\nkinetic: warning: a warning\n"
    assert out.stdout == ""


def test_an_application_that_configures_logging_gets_each_record_once() -> None:
    # Configured after `import kinetic`, as applications often do.
    script = (
        "import logging\nimport kinetic\n"
        'logging.basicConfig(level=logging.DEBUG, format="HOST %(levelname)s %(name)s %(message)s")\n'
        + _SAY
    )
    out = python(script)
    assert out.stderr.splitlines() == [
        "HOST INFO kinetic._engine.something a notice",
        "HOST WARNING kinetic._engine.something a warning",
    ]  # kinetic's level (INFO) holds back the detail; no "kinetic: " line besides


def test_a_handler_on_the_kinetic_logger_alone_takes_the_records() -> None:
    script = (
        "import io, logging\nimport kinetic\n"
        "mine = io.StringIO()\n"
        'logging.getLogger("kinetic").addHandler(logging.StreamHandler(mine))\n'
        + _SAY
        + "print(mine.getvalue(), end='')\n"
    )
    out = python(script)
    assert out.stdout == "a notice\na warning\n"
    assert out.stderr == ""


def test_a_level_set_before_import_stands() -> None:
    script = (
        'import logging\nlogging.getLogger("kinetic").setLevel(logging.WARNING)\n'
        "import kinetic\n" + _SAY
    )
    assert python(script).stderr == "kinetic: warning: a warning\n"


@pytest.mark.parametrize(
    ("env", "lines"),
    [
        ({"KINETIC_LOG_LEVEL": "ERROR"}, []),
        ({"KINETIC_LOG_LEVEL": "warning"}, ["kinetic: warning: a warning"]),
        (
            {"KINETIC_LOG_LEVEL": "Debug"},
            ["kinetic: debug: a detail", "kinetic: a notice", "kinetic: warning: a warning"],
        ),
        ({"KINETIC_QUIET": "1"}, ["kinetic: warning: a warning"]),
        (
            {"KINETIC_QUIET": "1", "KINETIC_LOG_LEVEL": "info"},
            ["kinetic: a notice", "kinetic: warning: a warning"],
        ),
        (
            {"KINETIC_LOG_LEVEL": "loud"},
            [
                (
                    "kinetic: warning: KINETIC_LOG_LEVEL='loud' is not a level; it is ignored "
                    "(valid, in any case: DEBUG, INFO, WARNING, ERROR)"
                ),
                "kinetic: a notice",
                "kinetic: warning: a warning",
            ],
        ),
    ],
)
def test_the_variables_set_the_level(env: dict[str, str], lines: list[str]) -> None:
    out = python("import logging\nimport kinetic\n" + _SAY, **env)
    assert out.stderr.splitlines() == lines
