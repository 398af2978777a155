"""What the package declares is what it uses (issue 28, section 4), and the metadata a
user of the index reads (section 5): the declared runtime dependencies against the
imports of ``kinetic/`` and ``runner/``, the extras of optional imports, the license,
the classifiers against the tox environments, and docs/architecture.md's table."""

from __future__ import annotations

import ast
import configparser
import importlib.metadata
import importlib.util
import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

OPTIONAL_IMPORTS = {
    # import name: (the extra that provides it, its distribution); why it is optional
    "datasets": ("hf", "datasets"),  # runner/data.py: hf:// data only
    "pynvml": ("gpu", "nvidia-ml-py"),  # local GPUs found through NVML
    "debugpy": ("debug", "debugpy"),  # runner/debug.py: debug=True jobs only
    "pytest": ("test", "pytest"),  # kinetic.testing: a plugin that pytest itself loads
}
TYPING_ONLY = {
    # import name: why type checkers have it with no dependency declared; imported only
    # under `if TYPE_CHECKING:`, never at run time
    "typing_extensions": "its stubs ship with every type checker (typeshed's standard library)",
}
BRIEF_PACKAGES = (
    "anyio",
    "gcloud-aio-storage",
    "kubernetes-asyncio",
    "httpx",
    "cloudpickle",
    "aiofiles",
    "tenacity",
    "pytest-asyncio",
)


def _imports() -> dict[str, set[str]]:
    """Third-party import names (``gcloud.aio.X`` kept whole: a namespace) -> files."""
    found: dict[str, set[str]] = {}
    for root in ("kinetic", "runner"):
        for path in (REPO / root).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                elif (
                    isinstance(node, ast.Call)
                    and getattr(node.func, "attr", "") == "import_module"
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                ):
                    names = [str(node.args[0].value)]
                for name in names:
                    parts = name.split(".")
                    top = ".".join(parts[:3]) if parts[0] == "gcloud" else parts[0]
                    if parts[0] in sys.stdlib_module_names or parts[0] in ("kinetic", "runner"):
                        continue
                    found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return found


def _distribution(import_name: str) -> str:
    """The installed distribution that provides ``import_name``, by its files (a
    namespace package such as ``gcloud`` is shared by several)."""
    spec = importlib.util.find_spec(import_name)
    assert spec is not None, f"{import_name} is not installed"
    where = Path(spec.origin or next(iter(spec.submodule_search_locations or []))).resolve()
    top = import_name.split(".")[0]
    for name in importlib.metadata.packages_distributions().get(top, []):
        dist = importlib.metadata.distribution(name)
        for file in dist.files or ():
            if file.parts[0] == top and Path(str(dist.locate_file(file))).resolve() == where:
                return canonicalize_name(name)
    raise AssertionError(f"no distribution holds {where}")


def _names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def test_runtime_dependencies_are_exactly_what_the_code_imports() -> None:
    imported = _imports()
    runtime = {
        _distribution(name): files
        for name, files in imported.items()
        if name.split(".")[0] not in OPTIONAL_IMPORTS and name not in TYPING_ONLY
    }
    declared = _names(PROJECT["dependencies"])
    assert not set(runtime) - declared, f"imported, not declared: {set(runtime) - declared}"
    assert not declared - set(runtime), f"declared, imported nowhere: {declared - set(runtime)}"


def test_each_optional_import_has_its_extra() -> None:
    extras = {k: _names(v) for k, v in PROJECT["optional-dependencies"].items()}
    imported = _imports()
    for name, (extra, dist) in OPTIONAL_IMPORTS.items():
        assert name in imported, f"{name} is no longer imported: drop it from OPTIONAL_IMPORTS"
        assert dist in extras[extra], (name, extra)
        if importlib.util.find_spec(name) is not None:
            assert _distribution(name) == dist
    assert extras["debug"] == {"debugpy"}


def test_typing_only_imports_are_for_type_checkers_only() -> None:
    imported = _imports()
    for name in TYPING_ONLY:
        assert name in imported, f"{name} is no longer imported: drop it from TYPING_ONLY"
        for file in imported[name]:
            tree = ast.parse((REPO / file).read_text())
            guarded = {
                id(node)
                for block in ast.walk(tree)
                if isinstance(block, ast.If) and ast.unparse(block.test).endswith("TYPE_CHECKING")
                for statement in block.body
                for node in ast.walk(statement)
            }
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module == name:
                    assert id(node) in guarded, f"{file}: {name} imported at run time"
                if isinstance(node, ast.Import) and name in (a.name for a in node.names):
                    assert id(node) in guarded, f"{file}: {name} imported at run time"


def test_the_test_extra_holds_both_async_test_plugins_and_the_kubeconfig_witness() -> None:
    test = _names(PROJECT["optional-dependencies"]["test"])
    assert {"pytest-asyncio", "kubernetes-asyncio"} <= test


def test_the_anyio_floor_has_the_test_configurations_anyio_mode() -> None:
    # anyio_mode (pyproject's pytest section) is an unknown option before anyio 4.11,
    # and --strict-config makes that an error: measured with 4.10.0 and 4.11.0.
    floor = next(Requirement(r) for r in PROJECT["dependencies"] if r.startswith("anyio"))
    assert "4.10.99" not in floor.specifier
    assert "4.11.0" in floor.specifier


def test_license_file_and_metadata() -> None:
    assert PROJECT["license"] == "Apache-2.0"
    assert PROJECT["license-files"] == ["LICENSE"]
    text = (REPO / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License")
    assert "Version 2.0, January 2004" in text
    # PEP 639: a license expression replaces the "License ::" classifiers.
    assert not [c for c in PROJECT["classifiers"] if c.startswith("License ::")]


def test_classifiers_name_every_python_the_tests_run_on() -> None:
    classifiers = set(PROJECT["classifiers"])
    assert {"Typing :: Typed", "Framework :: AsyncIO", "Framework :: AnyIO"} <= classifiers
    assert any(c.startswith("Operating System ::") for c in classifiers)
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(REPO / "tox.ini")
    envs = {e.strip() for e in tox["tox"]["envlist"].split(",")}
    tested = {"3.11"} | {f"3.{m[1]}" for m in (re.fullmatch(r"py3(\d+)", e) for e in envs) if m}
    assert {"3.12", "3.13"} <= tested
    for version in tested:
        assert f"Programming Language :: Python :: {version}" in classifiers


def test_the_dependencies_table_covers_each_dependency_and_the_briefs_packages() -> None:
    page = (REPO / "docs" / "architecture.md").read_text()
    section = page.split("## Dependencies", 1)[1].split("\n## ", 1)[0]
    rows = {
        canonicalize_name(m.group(1))
        for m in re.finditer(r"^\| `([A-Za-z0-9_.\-\[\]]+)`", section, re.MULTILINE)
    }
    rows = {r.split("[")[0] for r in rows}
    expected = _names(PROJECT["dependencies"]) | {canonicalize_name(p) for p in BRIEF_PACKAGES}
    assert expected <= rows, f"missing from the table: {expected - rows}"


def test_images_resolve_for_every_patch_of_their_python() -> None:
    # gcloud-aio-auth 5.6 needs Python >= 3.11.3; Debian bookworm's python3 (the test
    # cluster's base image) is 3.11.2. Images resolve for the minor's first release, and
    # a dependency installed here that needs a later one is resolved from its range.
    from kinetic._core.image_spec import resolver_python
    from kinetic._images.runner_image import pinned_requirements

    assert resolver_python("3.11") == "3.11.0"
    assert resolver_python("3.12.4") == "3.12.4"
    pins = pinned_requirements(python="3.11")
    assert "gcloud-aio-auth>=5.3" in pins
    assert any(p.startswith("anyio==") for p in pins)
