"""uv.lock and [dependency-groups] as the project's dependency sources: pure parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from kinetic._core.dependency_sources import (
    group_requirements,
    parse_group_names,
    project_requirements,
    selected_groups,
)
from kinetic._core.requirements import Requirement
from kinetic._core.uv_lock import locked_requirements
from kinetic._engine.requirements_io import read_project_requirements
from kinetic._exceptions import ConfigError, RequirementsError

PYPROJECT = """\
[project]
name = "demo"
version = "0.1.0"
dependencies = ["httpx[http2]>=0.27", "colorama ; sys_platform == 'win32'", "numpy", "tool"]

[dependency-groups]
train = ["tqdm>=4"]
dev = ["pytest", {include-group = "train"}]
"""

# The shape `uv lock` writes (format version 1), with the file entries left out.
LOCK = """\
version = 1
revision = 3
requires-python = ">=3.11"

[[package]]
name = "demo"
version = "0.1.0"
source = { editable = "." }
dependencies = [
    { name = "colorama", marker = "sys_platform == 'win32'" },
    { name = "httpx", extra = ["http2"] },
    { name = "numpy", version = "2.2.6", source = { registry = "https://pypi.org/simple" }, marker = "python_full_version < '3.12'" },
    { name = "numpy", version = "2.3.5", source = { registry = "https://pypi.org/simple" }, marker = "python_full_version >= '3.12'" },
    { name = "tool" },
]

[package.dev-dependencies]
dev = [{ name = "pytest" }, { name = "tqdm" }]
train = [{ name = "tqdm" }]

[package.metadata]
requires-dist = [
    { name = "colorama", marker = "sys_platform == 'win32'" },
    { name = "httpx", extras = ["http2"], specifier = ">=0.27" },
    { name = "numpy" },
    { name = "tool", git = "https://github.com/example/tool?rev=main" },
]

[package.metadata.requires-dev]
dev = [{ name = "pytest" }, { name = "tqdm", specifier = ">=4" }]
train = [{ name = "tqdm", specifier = ">=4" }]

[[package]]
name = "colorama"
version = "0.4.6"
source = { registry = "https://pypi.org/simple" }

[[package]]
name = "h2"
version = "4.1.0"
source = { registry = "https://pypi.org/simple" }
dependencies = [{ name = "hpack" }]

[[package]]
name = "hpack"
version = "4.0.0"
source = { registry = "https://pypi.org/simple" }
dependencies = [{ name = "h2" }]  # a cycle: walked once

[[package]]
name = "httpx"
version = "0.28.1"
source = { registry = "https://pypi.org/simple" }
dependencies = [
    { name = "typing-extensions", marker = "python_full_version < '3.13'" },
    { name = "pywin32", marker = "os_name == 'nt'" },
    { name = "certifi", marker = "sys_platform == 'linux'" },
]

[package.optional-dependencies]
http2 = [{ name = "h2" }]

[[package]]
name = "certifi"
version = "2025.1.31"
source = { url = "https://files.example/certifi-2025.1.31-py3-none-any.whl" }

[[package]]
name = "pywin32"
version = "310"
source = { registry = "https://pypi.org/simple" }

[[package]]
name = "numpy"
version = "2.2.6"
source = { registry = "https://pypi.org/simple" }
resolution-markers = ["python_full_version < '3.12'"]

[[package]]
name = "numpy"
version = "2.3.5"
source = { registry = "https://pypi.org/simple" }
resolution-markers = ["python_full_version >= '3.12'"]

[[package]]
name = "typing-extensions"
version = "4.13.2"
source = { registry = "https://pypi.org/simple" }

[[package]]
name = "tool"
version = "1.0"
source = { git = "https://github.com/example/tool?rev=main#0123456789abcdef0123456789abcdef01234567" }
dependencies = [{ name = "typing-extensions" }]

[[package]]
name = "pytest"
version = "8.3.5"
source = { registry = "https://pypi.org/simple" }

[[package]]
name = "tqdm"
version = "4.67.1"
source = { registry = "https://pypi.org/simple" }
dependencies = [{ name = "colorama", marker = "sys_platform == 'win32'" }]
"""

PROJECT_LINES = [
    "certifi @ https://files.example/certifi-2025.1.31-py3-none-any.whl",
    "h2==4.1.0",
    "hpack==4.0.0",
    "httpx==0.28.1",
    "numpy==2.2.6 ; python_full_version < '3.12'",
    "numpy==2.3.5 ; python_full_version >= '3.12'",
    "tool @ git+https://github.com/example/tool@0123456789abcdef0123456789abcdef01234567",
    "typing-extensions==4.13.2",
]


def lines(reqs: list[Requirement]) -> list[str]:
    return [r.line for r in reqs]


def lock_lines(groups: tuple[str, ...] = ()) -> list[str]:
    return lines(locked_requirements(LOCK, "demo", ["httpx", "colorama", "numpy", "tool"], groups))


# --- uv.lock ------------------------------------------------------------------------------


def test_the_lock_gives_the_closure_for_linux_with_its_python_markers() -> None:
    # Extras are followed (h2), a cycle is walked once (h2 <-> hpack), Windows-only edges
    # are dropped (colorama, pywin32), an always-true marker is dropped (certifi), a
    # Python bound stays (numpy's two versions); typing-extensions is reached both under
    # a bound and unconditionally (through tool): unconditional wins.
    assert lock_lines() == PROJECT_LINES


def test_a_selected_group_adds_its_locked_packages() -> None:
    assert lock_lines(("train",)) == sorted([*PROJECT_LINES, "tqdm==4.67.1"])
    assert lock_lines(("dev",)) == sorted([*PROJECT_LINES, "pytest==8.3.5", "tqdm==4.67.1"])


def test_lock_lines_name_their_source() -> None:
    reqs = locked_requirements(LOCK, "demo", [], ())
    assert {r.source for r in reqs if r.name == "h2"} == {"uv.lock h2 4.1.0"}
    assert all(r.name for r in reqs)
    assert not any(r.keep for r in reqs)


def test_markers_combine_along_a_path() -> None:
    text = LOCK.replace(
        '{ name = "tool" },\n]',
        '{ name = "tool", marker = "python_full_version >= \'3.12\'" },\n]',
    ).replace(
        '[{ name = "typing-extensions" }]',
        '[{ name = "six", marker = "python_version < \'3.14\'" }]',
    )
    text += '\n[[package]]\nname = "six"\nversion = "1.17.0"\nsource = { registry = "r" }\n'
    reqs = {r.name: r.line for r in locked_requirements(text, "demo", [], ())}
    assert reqs["six"] == (
        "six==1.17.0 ; (python_full_version >= '3.12') and (python_version < '3.14')"
    )
    assert reqs["typing-extensions"] == "typing-extensions==4.13.2 ; python_full_version < '3.13'"


def test_local_sources_are_written_as_a_requirements_file_would() -> None:
    text = LOCK.replace(
        'source = { git = "https://github.com/example/tool?rev=main#0123456789abcdef0123456789abcdef01234567" }',
        'source = { editable = "packages/tool" }',
    )
    reqs = [r for r in locked_requirements(text, "demo", [], ()) if r.line.startswith("-e")]
    assert [(r.line, r.name) for r in reqs] == [("-e ./packages/tool", None)]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        pytest.param("version = [", "uv.lock is malformed: not valid TOML", id="toml"),
        pytest.param(LOCK.replace("version = 1\n", "version = 2\n", 1), "format version 2", id="version"),
        pytest.param("revision = 1\n", "format version None", id="no-version"),
        pytest.param(LOCK.replace('name = "demo"', 'name = "other"'), "no package for the project 'demo'", id="no-root"),
        pytest.param(LOCK.replace('name = "hpack"\n', 'name = "hpackx"\n'), "no locked package matches 'hpack'", id="dangling-edge"),
        pytest.param(LOCK.replace('marker = "os_name', 'marker = "os_nam ==').replace("== 'nt'\"", "'nt'\""), "invalid marker", id="bad-marker"),
        pytest.param(LOCK.replace("http2 = [", "http3 = ["), "httpx has no extra 'http2'", id="no-extra"),
        pytest.param(LOCK.replace('version = "4.13.2"\nsource = { registry = "https://pypi.org/simple" }', 'version = "4.13.2"\nsource = { svn = "x" }'), "unknown source kind 'svn'", id="bad-source"),
    ],
)  # fmt: skip
def test_a_malformed_lock_is_a_requirements_error(text: str, match: str) -> None:
    with pytest.raises(RequirementsError, match=match) as info:
        locked_requirements(text, "demo", [], ())
    assert isinstance(info.value, ConfigError)
    assert "uv lock" in str(info.value)


def test_a_lock_older_than_pyproject_is_refused() -> None:
    with pytest.raises(
        RequirementsError, match=r"out of date .* does not lock rich; run `uv lock`"
    ):
        locked_requirements(LOCK, "demo", ["httpx", "rich"], ())
    with pytest.raises(RequirementsError, match="no dependency group eval"):
        locked_requirements(LOCK, "demo", [], ("eval",))


# --- [dependency-groups] and the choice of source -----------------------------------------


def test_group_names() -> None:
    assert parse_group_names(" train, eval ,,") == ("train", "eval")
    assert parse_group_names("") == ()


def test_groups_come_from_the_variable_else_tool_kinetic_else_none() -> None:
    import tomllib

    document = tomllib.loads(PYPROJECT + '\n[tool.kinetic]\ndependency-groups = ["Train"]\n')
    assert selected_groups(document, None) == ("train",)  # PEP 735 names are normalized
    assert selected_groups(document, ("dev",)) == ("dev",)
    assert selected_groups(document, ()) == ()
    assert selected_groups(tomllib.loads(PYPROJECT), None) == ()  # uv's dev is not implied


def test_an_unknown_group_is_named_with_the_defined_ones() -> None:
    import tomllib

    with pytest.raises(
        RequirementsError, match=r"KINETIC_DEPENDENCY_GROUPS .* eval, .*defines: dev, train"
    ):
        selected_groups(tomllib.loads(PYPROJECT), ("eval",))
    bad = tomllib.loads(PYPROJECT + "\n[tool.kinetic]\ndependency-groups = 'train'\n")
    with pytest.raises(
        RequirementsError, match=r"\[tool.kinetic\].dependency-groups must be a list"
    ):
        selected_groups(bad, None)


def test_group_entries_follow_includes_once_and_refuse_cycles() -> None:
    import tomllib

    document = tomllib.loads(PYPROJECT)
    got = group_requirements(document, ("dev", "train"))
    assert [(r.line, r.source) for r in got] == [
        ("pytest", "pyproject.toml [dependency-groups].dev[0]"),
        ("tqdm>=4", "pyproject.toml [dependency-groups].train[0]"),
    ]
    cyclic = tomllib.loads(
        '[dependency-groups]\na = [{include-group = "b"}]\nb = [{include-group = "a"}]\n'
    )
    with pytest.raises(RequirementsError, match="include each other: a -> b -> a"):
        group_requirements(cyclic, ("a",))
    for entry, match in [
        ("3", "must be a string"),
        ('"not a req!"', "cannot parse"),
        ('{include-group = "zz"}', "does not define"),
    ]:
        with pytest.raises(RequirementsError, match=match):
            group_requirements(tomllib.loads(f"[dependency-groups]\na = [{entry}]\n"), ("a",))


def test_precedence_requirements_txt_then_lock_then_pyproject() -> None:
    assert lines(project_requirements("six\n", PYPROJECT, LOCK, None)) == ["six"]
    assert lines(project_requirements(None, PYPROJECT, LOCK, None)) == PROJECT_LINES
    assert lines(project_requirements(None, PYPROJECT, None, ("train",))) == [
        "httpx[http2]>=0.27",
        "colorama ; sys_platform == 'win32'",
        "numpy",
        "tool",
        "tqdm>=4",
    ]
    assert lines(project_requirements(None, None, None, ("train",))) == []
    with pytest.raises(RequirementsError, match=r"names none \(\[project\].name\)"):
        project_requirements(None, "[dependency-groups]\na = []\n", LOCK, None)


def test_the_files_are_read_from_the_root_with_the_variable(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    (tmp_path / "uv.lock").write_text(LOCK)
    assert lines(read_project_requirements(tmp_path, {})) == PROJECT_LINES
    with_group = read_project_requirements(tmp_path, {"KINETIC_DEPENDENCY_GROUPS": "train"})
    assert "tqdm==4.67.1" in lines(with_group)
    (tmp_path / "uv.lock").write_text("version = 1\n[[package]\n")
    with pytest.raises(RequirementsError, match="uv.lock is malformed"):
        read_project_requirements(tmp_path, {})
    (tmp_path / "requirements.txt").write_text("six\n")  # wins: the lock is not read
    assert lines(read_project_requirements(tmp_path, {})) == ["six"]
