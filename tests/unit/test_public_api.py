"""The public surface is curated, and the blocking and async worlds match name for name."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import ModuleType

import pytest

import kinetic
from kinetic import aio

PACKAGE = Path(kinetic.__file__).parent


def _public_attributes(module: ModuleType) -> set[str]:
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not (isinstance(value, ModuleType) and value is not aio)
        and name != "annotations"
    }


@pytest.mark.parametrize("module", [kinetic, aio])
def test_all_is_sorted_and_complete(module: ModuleType) -> None:
    exported = list(module.__all__)
    assert exported == sorted(exported)
    assert len(set(exported)) == len(exported)
    assert {n for n in exported if not n.startswith("__")} == _public_attributes(module)
    for name in exported:
        assert hasattr(module, name), name


def test_every_async_name_has_a_blocking_twin() -> None:
    assert set(aio.__all__) <= set(kinetic.__all__)


def _methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and callable(member) and name not in {"aio"}
    }


def _params(sig: inspect.Signature) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


@pytest.mark.parametrize("name", ["BatchHandle", "JobHandle", "RemoteFunction"])
def test_classes_have_the_same_methods_and_parameters(name: str) -> None:
    sync_cls, async_cls = getattr(kinetic, name), getattr(aio, name)
    sync_methods, async_methods = _methods(sync_cls), _methods(async_cls)
    assert set(sync_methods) == set(async_methods)
    for method, sig in async_methods.items():
        assert _params(sync_methods[method]) == _params(sig), f"{name}.{method}"


def test_waiting_methods_are_coroutines_only_in_aio() -> None:
    for method in ("status", "result", "logs", "tail", "cancel", "cleanup"):
        assert inspect.iscoroutinefunction(getattr(aio.JobHandle, method)), method
        assert not inspect.iscoroutinefunction(getattr(kinetic.JobHandle, method)), method
    assert inspect.iscoroutinefunction(aio.RemoteFunction.run_async)
    assert not inspect.iscoroutinefunction(kinetic.RemoteFunction.run_async)
    for method in ("statuses", "status_counts", "wait", "results", "failures", "cancel"):
        assert inspect.iscoroutinefunction(getattr(aio.BatchHandle, method)), method
        assert not inspect.iscoroutinefunction(getattr(kinetic.BatchHandle, method)), method
    assert inspect.isasyncgenfunction(aio.BatchHandle.as_completed)
    assert inspect.isgeneratorfunction(kinetic.BatchHandle.as_completed)


@pytest.mark.parametrize("name", ["run", "attach", "attach_batch", "list_jobs"])
def test_functions_have_the_same_parameters(name: str) -> None:
    sync_sig = inspect.signature(getattr(kinetic, name))
    async_sig = inspect.signature(getattr(aio, name))
    assert _params(sync_sig) == _params(async_sig)


def test_run_keeps_every_parameter_of_the_original() -> None:
    original = [
        "accelerator",
        "container_image",
        "base_image_repo",
        "zone",
        "project",
        "capture_env_vars",
        "cluster",
        "backend",
        "namespace",
        "volumes",
        "spot",
        "output_dir",
        "debug",
    ]
    # In the original's order (positional calls keep working); Kinetic's own follow.
    assert list(inspect.signature(kinetic.run).parameters) == [
        *original,
        "secrets",
        "timeout",
        "retries",
    ]


def test_handle_fields_match_the_original() -> None:
    fields = [
        "job_id", "backend", "project", "cluster_name", "zone", "namespace", "bucket_name",
        "k8s_name", "image_uri", "accelerator", "func_name", "display_name", "created_at",
        "group_id", "group_kind", "group_index", "debug",
    ]  # fmt: skip
    assert list(kinetic.JobHandle.field_names()) == fields


def test_public_names_have_docstrings() -> None:
    for module in (kinetic, aio):
        for name in module.__all__:
            obj = getattr(module, name)
            if callable(obj) or isinstance(obj, ModuleType):
                assert inspect.getdoc(obj), f"{module.__name__}.{name}"


def test_pure_core_does_no_io_imports() -> None:
    forbidden = {"asyncio", "anyio", "socket", "subprocess", "aiohttp", "httpx"}
    for path in (PACKAGE / "_core").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                names = {(node.module or "").split(".")[0]}
            else:
                continue
            assert not names & forbidden, f"{path.name} imports {names & forbidden}"


def test_runner_never_imports_kinetic_at_start_up() -> None:
    for path in (PACKAGE.parent / "runner").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:  # module level only: the GCS store is imported lazily
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("kinetic"), path.name
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("kinetic") for a in node.names), path.name
