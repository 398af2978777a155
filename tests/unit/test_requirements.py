"""Dependency discovery rules: parsing, choosing, the accelerator filter, prebuilt checks."""

from __future__ import annotations

import pytest

from kinetic._core.requirements import (
    Requirement,
    check_installable_remotely,
    choose_requirements,
    parse_pyproject_dependencies,
    parse_requirements_txt,
    requirements_digest_text,
    requirements_lines,
)
from kinetic._exceptions import ConfigError, RequirementsError

PYPROJECT = """\
[project]
name = "demo"
dependencies = ["pandas>=2", "Scikit_Learn ; python_version >= '3.9'"]
"""


def names(reqs: list[Requirement]) -> list[str | None]:
    return [r.name for r in reqs]


# --- choosing the file ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("requirements_txt", "pyproject_toml", "expected"),
    [
        pytest.param("numpy\n", PYPROJECT, ["numpy"], id="requirements-txt-wins"),
        pytest.param("# nothing\n", PYPROJECT, [], id="empty-requirements-txt-still-wins"),
        pytest.param(None, PYPROJECT, ["pandas", "scikit-learn"], id="pyproject-used"),
        pytest.param(None, None, [], id="neither"),
        pytest.param(None, "[tool.ruff]\nline-length = 100\n", [], id="pyproject-no-project"),
        pytest.param(
            None, '[project]\nname = "x"\ndynamic = ["dependencies"]\n', [], id="no-deps-key"
        ),
        pytest.param("numpy\n", "this is [ not toml", ["numpy"], id="pyproject-not-parsed"),
    ],
)
def test_choose_requirements(
    requirements_txt: str | None, pyproject_toml: str | None, expected: list[str]
) -> None:
    assert names(choose_requirements(requirements_txt, pyproject_toml)) == expected


def test_pyproject_sources_and_lines() -> None:
    reqs = parse_pyproject_dependencies(PYPROJECT)
    assert reqs == [
        Requirement("pandas>=2", "pandas", "pyproject.toml [project].dependencies[0]"),
        Requirement(
            "Scikit_Learn ; python_version >= '3.9'",
            "scikit-learn",
            "pyproject.toml [project].dependencies[1]",
        ),
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("[tool.x]\na = 1\n", None, id="no-project-table"),
        pytest.param('[project]\nname = "x"\n', None, id="no-dependencies"),
        pytest.param("[project]\ndependencies = []\n", [], id="declared-empty"),
    ],
)
def test_pyproject_declares_nothing(text: str, expected: list[Requirement] | None) -> None:
    assert parse_pyproject_dependencies(text) == expected


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        pytest.param("[project\n", "not valid TOML", id="bad-toml"),
        pytest.param('[project]\ndependencies = "numpy"\n', "must be a list", id="not-a-list"),
        pytest.param("[project]\ndependencies = [1]\n", "dependencies[0]", id="not-a-string"),
        pytest.param(
            '[project]\ndependencies = ["ok", "foo bar"]\n', "dependencies[1]", id="bad-entry"
        ),
    ],
)
def test_bad_pyproject(text: str, needle: str) -> None:
    with pytest.raises(RequirementsError, match="pyproject.toml") as info:
        parse_pyproject_dependencies(text)
    assert needle in str(info.value)


# --- parsing requirements.txt ----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "\n# comment\n  \nnumpy>=1  # pinned\n",
            [Requirement("numpy>=1", "numpy", "requirements.txt:4")],
            id="blank-and-comments",
        ),
        pytest.param(
            "jax[tpu]>=0.4  # kn:keep\n",
            [Requirement("jax[tpu]>=0.4", "jax", "requirements.txt:1", keep=True)],
            id="keep-marker",
        ),
        pytest.param(
            "jax  # needed for x; kn:keep please\n",
            [Requirement("jax", "jax", "requirements.txt:1", keep=True)],
            id="keep-anywhere-in-comment",
        ),
        pytest.param(
            "# kn:keep\njax\n",
            [Requirement("jax", "jax", "requirements.txt:2")],
            id="keep-on-comment-line-is-not-inherited",
        ),
        pytest.param(
            "numpy \\\n  >=1.26 \\\n  ; python_version > '3'  # kn:keep\nrich\n",
            [
                Requirement(
                    "numpy   >=1.26   ; python_version > '3'", "numpy", "requirements.txt:1", True
                ),
                Requirement("rich", "rich", "requirements.txt:4"),
            ],
            id="continuation",
        ),
        pytest.param(
            "Zope.Interface==6\n",
            [Requirement("Zope.Interface==6", "zope-interface", "requirements.txt:1")],
            id="canonical-name",
        ),
        pytest.param(
            "pkg @ https://example.invalid/p.whl\n",
            [Requirement("pkg @ https://example.invalid/p.whl", "pkg", "requirements.txt:1")],
            id="direct-reference",
        ),
        pytest.param(
            "https://example.invalid/x.whl#egg=Foo_Bar\nhttps://example.invalid/y.whl\n",
            [
                Requirement(
                    "https://example.invalid/x.whl#egg=Foo_Bar", "foo-bar", "requirements.txt:1"
                ),
                Requirement("https://example.invalid/y.whl", None, "requirements.txt:2"),
            ],
            id="bare-urls-fragment-is-not-a-comment",
        ),
        pytest.param(
            "./pkg\n../x\n/abs/x.whl\nfile:///tmp/x.whl\n",
            [
                Requirement("./pkg", None, "requirements.txt:1"),
                Requirement("../x", None, "requirements.txt:2"),
                Requirement("/abs/x.whl", None, "requirements.txt:3"),
                Requirement("file:///tmp/x.whl", None, "requirements.txt:4"),
            ],
            id="paths",
        ),
        pytest.param(
            "--index-url https://example.invalid/simple\n-e git+https://e.invalid/r.git#egg=R\n"
            "-e .\n--pre\n-r other.txt\n",
            [
                Requirement(
                    "--index-url https://example.invalid/simple", None, "requirements.txt:1"
                ),
                Requirement("-e git+https://e.invalid/r.git#egg=R", "r", "requirements.txt:2"),
                Requirement("-e .", None, "requirements.txt:3"),
                Requirement("--pre", None, "requirements.txt:4"),
                Requirement("-r other.txt", None, "requirements.txt:5"),
            ],
            id="options",
        ),
        pytest.param(
            "numpy==1.26.4 --hash=sha256:abc\n",
            [Requirement("numpy==1.26.4 --hash=sha256:abc", "numpy", "requirements.txt:1")],
            id="per-requirement-option",
        ),
    ],
)
def test_parse_requirements_txt(text: str, expected: list[Requirement]) -> None:
    assert parse_requirements_txt(text) == expected


@pytest.mark.parametrize(
    ("text", "line_ref", "line_text"),
    [
        pytest.param("ok\nnumpy>=>1\n", "line 2", "numpy>=>1", id="bad-specifier"),
        pytest.param("foo bar  # x\n", "line 1", "foo bar", id="two-words"),
        pytest.param("a\n\nb \\\n  c\n", "line 3", "b   c", id="continued"),
        pytest.param("-r\n", "line 1", "-r", id="option-without-argument"),
    ],
)
def test_unparsable_line(text: str, line_ref: str, line_text: str) -> None:
    with pytest.raises(RequirementsError) as info:
        parse_requirements_txt(text, source_name="reqs/dev.txt")
    message = str(info.value)
    assert f"reqs/dev.txt {line_ref}" in message
    assert repr(line_text) in message
    assert "Expected" in message or "argument" in message  # the parser's reason
    assert isinstance(info.value, ConfigError)


# --- prebuilt mode: what a pod can install --------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "-e .",
        "-e ./pkg",
        "--editable=/x",
        "-e file:///x",
        "-r other.txt",
        "--requirement=other.txt",
        "-c constraints.txt",
        "file:///tmp/x.whl",
        "./pkg",
        "../pkg",
        "pkg/",
        "/abs/x.whl",
        "x-1.0.tar.gz",
        "dist/x-1.0-py3-none-any.whl",
        "pkg @ ./local",
        "pkg @ file:///x",
        "--find-links ./wheels",
    ],
)
def test_rejected_for_prebuilt(line: str) -> None:
    reqs = parse_requirements_txt(f"requests>=2\n# comment\n{line}  # why\n")
    with pytest.raises(RequirementsError) as info:
        check_installable_remotely(reqs)
    message = str(info.value)
    assert message.startswith(f"requirements.txt:3: {line!r}")
    assert "uv pip install" in message


@pytest.mark.parametrize(
    "line",
    [
        "requests>=2",
        "pkg @ https://example.invalid/x.whl",
        "https://example.invalid/x-1.0-py3-none-any.whl",
        "-e git+https://example.invalid/r.git#egg=r",
        "git+https://example.invalid/r.git#egg=r",
        "--index-url https://example.invalid/simple",
        "--extra-index-url=https://example.invalid/simple",
        "--find-links https://example.invalid/wheels",
        "--pre",
        "numpy==1.26.4 --hash=sha256:abc",
    ],
)
def test_accepted_for_prebuilt(line: str) -> None:
    check_installable_remotely(parse_requirements_txt(line))


def test_prebuilt_lists_every_offending_line() -> None:
    reqs = parse_requirements_txt("-e .\nrequests\n-r b.txt\n./pkg\n")
    with pytest.raises(RequirementsError) as info:
        check_installable_remotely(reqs)
    first, *rest = str(info.value).splitlines()
    assert first.startswith("requirements.txt:1: '-e .'")
    assert [line.split(":")[1] for line in rest[1:]] == ["3", "4"]


def test_pyproject_local_reference_rejected_with_its_source() -> None:
    reqs = parse_pyproject_dependencies('[project]\ndependencies = ["a", "b @ file:///x"]\n')
    assert reqs is not None
    with pytest.raises(RequirementsError, match=r"dependencies\[1\]: 'b @ file:///x'"):
        check_installable_remotely(reqs)


# --- lines for uv and the digest text -------------------------------------------------


def test_requirements_lines_drop_comments_and_keep_order() -> None:
    reqs = parse_requirements_txt("b  # x\n# y\na\n--pre\n")
    assert requirements_lines(reqs) == ["b", "a", "--pre"]


BASE = "numpy>=1.26\npandas==2.2  # data\n"


@pytest.mark.parametrize(
    ("edited", "same"),
    [
        pytest.param("# new header\nnumpy>=1.26\n\npandas==2.2  # tables\n", True, id="comments"),
        pytest.param("  numpy>=1.26   \npandas==2.2\n\n\n", True, id="whitespace"),
        pytest.param("numpy>=1.26\npandas==2.2  # kn:keep\n", True, id="keep-marker"),
        pytest.param("numpy>=2\npandas==2.2\n", False, id="version-change"),
        pytest.param("pandas==2.2\nnumpy>=1.26\n", False, id="reordered"),
        pytest.param("numpy>=1.26\npandas==2.2\nrich\n", False, id="added"),
    ],
)
def test_digest_text(edited: str, same: bool) -> None:
    before = requirements_digest_text(parse_requirements_txt(BASE))
    after = requirements_digest_text(parse_requirements_txt(edited))
    assert (before == after) is same
