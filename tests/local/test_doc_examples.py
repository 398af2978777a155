"""Every Python example of the README and docs/ runs, on the local backend.

See :mod:`tests.doc_examples` for how examples are found, marked and run. A page's
local examples run in one fresh interpreter, with a temporary ``KINETIC_LOCAL_ROOT``
and none of the shell's ``KINETIC_*`` settings; ``pytest`` examples run as test modules
with the :mod:`kinetic.testing` plugin. Cluster examples run in
``tests/cluster/test_doc_examples_cluster.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kinetic.testing import local_environment
from tests.doc_examples import (
    REPO,
    Example,
    ExampleSyntaxError,
    extract,
    pages,
    run_pytest_example,
    run_session,
)

pytestmark = [pytest.mark.local, pytest.mark.timeout(300)]

_ALL = {page: extract(page) for page in pages()}
_LOCAL_PAGES = [p for p, examples in _ALL.items() if any(e.kind == "local" for e in examples)]
_PYTEST_EXAMPLES = [e for examples in _ALL.values() for e in examples if e.kind == "pytest"]


def _env(tmp_path: Path) -> dict[str, str]:
    """The session's environment: a private local backend, and a private ``TMPDIR`` (the
    pages' ``tempfile.mkdtemp()`` folders, the jobs' scratch) that the test's
    ``tmp_path`` cleans up, rather than ``/tmp``."""
    from tests.doc_examples import clean_environment

    temp = tmp_path / "tmp"
    temp.mkdir(exist_ok=True)
    return clean_environment({**local_environment(tmp_path), "TMPDIR": str(temp)})


@pytest.mark.parametrize("page", _LOCAL_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_page_examples_run(page: Path, tmp_path: Path) -> None:
    examples = [e for e in _ALL[page] if e.kind == "local"]
    outcome = run_session(examples, tmp_path / "example", _env(tmp_path))
    assert outcome.returncode == 0, outcome.output


@pytest.mark.parametrize("example", _PYTEST_EXAMPLES, ids=lambda e: e.label)
def test_pytest_examples_pass(example: Example, tmp_path: Path) -> None:
    outcome = run_pytest_example(example, tmp_path / "example", _env(tmp_path))
    assert outcome.returncode == 0, outcome.output
    assert " passed" in outcome.output, outcome.output


def test_docs_have_runnable_examples() -> None:
    # The documentation keeps its promise only if the examples really are collected.
    assert len(_LOCAL_PAGES) >= 10
    assert _PYTEST_EXAMPLES
    skipped = [e for examples in _ALL.values() for e in examples if e.kind == "skip"]
    assert all(e.reason for e in skipped)


# ----------------------------------------------------------------- the harness itself


def test_a_failing_example_fails_and_names_its_line(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n```python\nx = 1\n```\n\ntext\n\n```python\n\nassert x == 2, 'no'\n```\n"
    )
    outcome = run_session(extract(page), tmp_path / "run", _env(tmp_path))
    assert outcome.returncode == 1
    assert f'File "{page}", line 11' in outcome.output
    assert "AssertionError: no" in outcome.output


def test_blocks_share_a_page_session_and_one_event_loop(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nimport asyncio\nfirst = None\n```\n"
        "```python\nawait asyncio.sleep(0)\nfirst = asyncio.get_running_loop()\n```\n"
        "```python\nawait asyncio.sleep(0)\nassert asyncio.get_running_loop() is first\n```\n"
        "```python\ntry:\n    asyncio.get_running_loop()\nexcept RuntimeError:\n    pass\n"
        "else:\n    raise AssertionError('a plain block ran inside the loop')\n```\n"
    )
    outcome = run_session(extract(page), tmp_path / "run", _env(tmp_path))
    assert outcome.returncode == 0, outcome.output


def test_markers(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- example: skip a fragment -->\n```python\n@decorator\n```\n"
        "- item\n\n  <!-- example: cluster -->\n\n  ```python\n  f()\n  ```\n"
        "```text\nnot python\n```\n```py\nplain = 1\n```\n"
    )
    got = [(e.kind, e.reason, e.line, e.source) for e in extract(page)]
    assert got == [
        ("skip", "a fragment", 3, "@decorator\n"),
        ("cluster", "", 10, "f()\n"),
        ("local", "", 16, "plain = 1\n"),
    ]


@pytest.mark.parametrize(
    "marker", ["<!-- example: skip -->", "<!-- example: sometimes -->"], ids=["no-reason", "kind"]
)
def test_bad_markers_are_errors(tmp_path: Path, marker: str) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"{marker}\n```python\npass\n```\n")
    with pytest.raises(ExampleSyntaxError):
        extract(page)
