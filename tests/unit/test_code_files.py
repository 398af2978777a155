"""A function shipped by value keeps the file names of its code (runner.code_files)."""

from __future__ import annotations

import importlib
import sys
import textwrap
import traceback
import types
from collections.abc import Iterator
from pathlib import Path

import cloudpickle
import pytest

from runner.code_files import load_function, point_code_at

SOURCE = """\
def helper(x):
    return [i * 2 for i in range(x)]


class Model:
    def forward(self, x):
        return helper(x)


def main(x):
    if x < 0:
        raise ValueError("negative input")
    return sum(Model().forward(x))
"""


@pytest.fixture
def shipped_module(tmp_path: Path) -> Iterator[types.ModuleType]:
    """A project module, registered to travel by value as a job's module does."""
    (tmp_path / "kcf_train.py").write_text(SOURCE)
    sys.path.insert(0, str(tmp_path))
    module = importlib.import_module("kcf_train")
    cloudpickle.register_pickle_by_value(module)
    try:
        yield module
    finally:
        cloudpickle.unregister_pickle_by_value(module)
        sys.path.remove(str(tmp_path))
        sys.modules.pop("kcf_train", None)


def _files(code: types.CodeType) -> set[str]:
    out = {code.co_filename}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= _files(const)
    return out


def test_shipped_code_names_its_modules_file(shipped_module: types.ModuleType) -> None:
    fn = load_function(cloudpickle.dumps(shipped_module.main))
    module_file = shipped_module.__file__
    for code in (fn.__code__, fn.__globals__["helper"].__code__):
        assert _files(code) == {module_file}
    assert _files(fn.__globals__["Model"].forward.__code__) == {module_file}
    assert fn(3) == 6


def test_a_remote_traceback_shows_the_file_and_the_line(
    shipped_module: types.ModuleType,
) -> None:
    fn = load_function(cloudpickle.dumps(shipped_module.main))
    with pytest.raises(ValueError, match="negative input") as info:
        fn(-1)
    text = "".join(traceback.format_exception(info.value))
    assert f'File "{shipped_module.__file__}", line 12, in main' in text
    assert 'raise ValueError("negative input")' in text


def test_code_without_a_module_file_is_left_alone() -> None:
    namespace: dict[str, object] = {"__name__": "__main__"}
    exec(compile("def f():\n    return 1\n", "<stdin>", "exec"), namespace)  # noqa: S102
    fn = load_function(cloudpickle.dumps(namespace["f"]))
    assert fn() == 1
    assert fn.__code__.co_filename in {"<stdin>", "<dynamic-code>"}


def test_point_code_at_renames_code_shipped_by_value() -> None:
    source = textwrap.dedent(
        """
        def helper(x):
            return [i for i in range(x)]

        class Model:
            def forward(self, x):
                return helper(x)

            @staticmethod
            def build():
                return Model()

        def main(x):
            inner = lambda y: y + 1
            return inner(len(Model.build().forward(x)))
        """
    )
    module: dict[str, object] = {"__name__": "shipped"}
    exec(compile(source, "/home/me/proj/pkg/train.py", "exec"), module)  # noqa: S102
    outside: dict[str, object] = {"__name__": "elsewhere"}
    exec(compile("def other(): pass", "/usr/lib/other.py", "exec"), outside)  # noqa: S102
    module["other"] = outside["other"]

    point_code_at(module["main"], "/home/me/proj", "/tmp/run/workspace")

    model = module["Model"]
    for fn in (module["main"], module["helper"], model.forward, model.build):  # type: ignore[attr-defined]
        assert _files(fn.__code__) == {"/tmp/run/workspace/pkg/train.py"}
    assert module["other"].__code__.co_filename == "/usr/lib/other.py"  # type: ignore[attr-defined]
    assert module["main"](3) == 4  # type: ignore[operator]
