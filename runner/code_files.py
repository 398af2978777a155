"""The file names in a shipped function's code: put back, and moved to the job's copy.

A job's function travels by value (cloudpickle), with the functions and classes of its
module that it uses. Its code objects name the file they were written in; tracebacks
read that name (and the file's lines), and a debugger matches breakpoints by it.

cloudpickle 3.1.3 and later ship every such code object under the name
``<dynamic-code>`` (so that a payload is the same wherever it was built). The file is
not lost: the module's ``__file__`` travels with the function's globals.
:func:`load_function` and :func:`restore_code_files` give the code its name back, so a
remote traceback says where the error was raised, with the line, as it did before.

Standard library and cloudpickle only, like the rest of ``runner``.
"""

from __future__ import annotations

import os
import types
from collections.abc import Callable
from typing import Any

import cloudpickle

DYNAMIC_CODE = "<dynamic-code>"
"""The file name cloudpickle (3.1.3 and later) gives code it ships by value."""


def load_function(data: bytes) -> Any:
    """Unpickle a shipped function, its code named after its module's file again."""
    fn = cloudpickle.loads(data)
    restore_code_files(fn)
    return fn


def restore_code_files(fn: Any) -> None:
    """Name the code that travelled as ``<dynamic-code>`` after its module's file.

    Leaves ``fn`` alone when its module had no file (``__main__`` of an interactive
    session, a notebook) or its code kept its names (cloudpickle before 3.1.3).
    """
    module_globals = getattr(getattr(fn, "__func__", fn), "__globals__", None)
    filename = module_globals.get("__file__") if isinstance(module_globals, dict) else None
    if isinstance(filename, str) and filename:
        rename_code_files(fn, lambda name: filename if name == DYNAMIC_CODE else name)


def point_code_at(fn: Any, source_root: str, code_root: str) -> None:
    """Rename the files of ``fn``'s code from ``source_root`` to ``code_root``.

    Why: the function's module travels by value, so its code objects name their files
    as they were on the submitting machine, while the modules it imports run from the
    job's copy of the project. A debugger matches breakpoints by file: with every piece
    of the project's code named under ``code_root``, one path mapping (``localRoot`` =
    the project here, ``remoteRoot`` = ``code_root``) serves them all, and the files
    exist where the debugger looks for them.
    """
    prefix = source_root.rstrip(os.sep) + os.sep
    new_root = code_root.rstrip(os.sep)

    def move(name: str) -> str:
        return new_root + os.sep + name[len(prefix) :] if name.startswith(prefix) else name

    rename_code_files(fn, move)


def rename_code_files(fn: Any, rename: Callable[[str], str]) -> None:
    """Give each code object of ``fn`` the file name ``rename(its name)``.

    Covers ``fn`` and the functions and classes of its module that travelled with it
    (same globals), nested code included; code objects are replaced, nothing else
    changes.
    """

    def fix_code(code: types.CodeType) -> types.CodeType:
        consts = tuple(fix_code(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
        name = rename(code.co_filename)
        changed = name != code.co_filename or any(
            a is not b for a, b in zip(consts, code.co_consts, strict=True)
        )
        return code.replace(co_filename=name, co_consts=consts) if changed else code

    seen: set[int] = set()

    def fix_function(f: Any) -> None:
        f = getattr(f, "__func__", f)  # staticmethod, classmethod, bound method
        if not isinstance(f, types.FunctionType) or id(f) in seen:
            return
        seen.add(id(f))
        f.__code__ = fix_code(f.__code__)

    fix_function(fn)
    module_globals = getattr(getattr(fn, "__func__", fn), "__globals__", None)
    if not isinstance(module_globals, dict):
        return
    for value in list(module_globals.values()):
        if isinstance(value, types.FunctionType) and value.__globals__ is module_globals:
            fix_function(value)
        elif isinstance(value, type) and value.__module__ == module_globals.get("__name__"):
            for attr in list(vars(value).values()):
                fix_function(attr)
                if isinstance(attr, property):
                    for accessor in (attr.fget, attr.fset, attr.fdel):
                        fix_function(accessor)
