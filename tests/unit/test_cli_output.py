"""Exit codes and plain output shared by every command (pure)."""

from __future__ import annotations

from kinetic._cli._output import exit_code_for, plain_lines
from kinetic._cli.jobs import results_document
from kinetic._exceptions import (
    AcceleratorError,
    BackendError,
    ConfigError,
    JobFailedError,
    JobNotFoundError,
    JobTimeoutError,
    ObjectNotFoundError,
    ProfileError,
)


def test_exit_codes_by_kind_of_error() -> None:
    assert exit_code_for(JobFailedError("x")) == 1
    assert exit_code_for(BackendError("x")) == 1
    assert exit_code_for(ConfigError("x")) == 2
    assert exit_code_for(AcceleratorError("x")) == 2
    assert exit_code_for(ProfileError("x")) == 2
    assert exit_code_for(JobNotFoundError("x")) == 3
    assert exit_code_for(ObjectNotFoundError("k", "b")) == 3
    assert exit_code_for(JobTimeoutError("x")) == 4
    assert exit_code_for(KeyError("not ours")) == 1


def test_plain_lines_align_and_mark_missing_values() -> None:
    lines = plain_lines(("name", "n"), [("a", 1), ("long-name", None), ("b", True)])
    assert lines == ["NAME       N", "a          1", "long-name  -", "b          yes"]


def test_results_document() -> None:
    err = KeyError("k")
    err.add_note("Remote traceback: ...")
    docs = results_document([1, ValueError("bad"), "x", err])
    assert docs[0] == {"index": 0, "ok": True, "value": 1}
    assert docs[1] == {"index": 1, "ok": False, "error": "ValueError: bad", "type": "ValueError"}
    assert docs[2]["value"] == "x"
    assert docs[3]["notes"] == "Remote traceback: ..."
    assert docs[3]["error"] == "KeyError: 'k'"
