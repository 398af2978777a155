"""Every task group whose errors can reach a user is unwrapped the one way
(``kinetic/_core/exception_groups.one_error``), so that callers see one Kinetic error,
never an ``ExceptionGroup``. A task group that needs no unwrapping is listed here with
the reason."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kinetic

PACKAGE = Path(kinetic.__file__).parent

EXEMPT = {
    # Each check's failure is caught and becomes its result.
    ("_cli/doctor_checks.py", "_gather"),
    # Runs inside subscribe's task group, which is unwrapped.
    ("_backends/gke/watch.py", "_drive"),
    # Its children only wait for events and raise nothing.
    ("_backends/gke/watch.py", "either_set"),
    # The debug forward's own thread: what fails before it serves happens outside the
    # group and is translated by _run; later failures are logged, never raised.
    ("_debug/forward.py", "_main"),
    # One relayed connection: its pipes note their errors and never raise.
    ("_debug/forward.py", "_relay"),
}


def _is_task_group(item: ast.withitem) -> bool:
    call = item.context_expr
    return (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "create_task_group"
    )


def _is_one_error(node: ast.AST) -> bool:
    return isinstance(node, ast.With) and any(
        isinstance(i.context_expr, ast.Call)
        and isinstance(i.context_expr.func, ast.Name)
        and i.context_expr.func.id == "one_error"
        for i in node.items
    )


def _bare_task_groups(tree: ast.AST) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []

    def walk(node: ast.AST, function: str, unwrapped: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function, unwrapped = node.name, False
        if _is_one_error(node):
            unwrapped = True
        bare = isinstance(node, ast.AsyncWith) and not unwrapped
        if bare and any(_is_task_group(i) for i in node.items):
            found.append((function, node.lineno))
        for child in ast.iter_child_nodes(node):
            walk(child, function, unwrapped)

    walk(tree, "<module>", False)
    return found


def test_every_task_group_is_unwrapped_or_exempt_with_a_reason() -> None:
    bare = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for function, line in _bare_task_groups(ast.parse(path.read_text())):
            if (rel, function) not in EXEMPT:
                bare.append(f"{rel}:{line} ({function})")
    assert bare == [], "wrap these in exception_groups.one_error(), or exempt them here"


def test_one_error_keeps_the_errors_own_cause() -> None:
    from kinetic._core.exception_groups import one_error

    cause = OSError("disk")

    def group_from_a_cause() -> None:
        try:
            raise cause
        except OSError as exc:
            raise ExceptionGroup("g", [kinetic.StorageError("read failed")]) from exc

    with pytest.raises(kinetic.StorageError) as first, one_error():
        group_from_a_cause()
    assert first.value.__cause__ is None  # it had none; the group is not shown
    assert first.value.__suppress_context__
    inner = kinetic.StorageError("x")
    inner.__cause__ = cause
    with pytest.raises(kinetic.StorageError) as second, one_error():
        raise BaseExceptionGroup("g", [ExceptionGroup("h", [inner])])
    assert second.value is inner
    assert second.value.__cause__ is cause
