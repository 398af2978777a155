"""``T``: the type of a job's value, the parameter of ``JobHandle[T]`` and ``BatchHandle[T]``.

``fn.run_async(...)`` on a function returning ``int`` gives a ``JobHandle[int]``, whose
``result()`` is an ``int``. A handle rebuilt from storage (``attach``, ``from_dict``,
``list_jobs``, ``attach_batch``) knows no function: it is a ``JobHandle[Any]``, unless
the caller writes ``JobHandle[int].from_dict(d)`` or annotates it.

The parameter's default is ``Any`` (PEP 696), so that a bare ``JobHandle`` annotation
still means ``JobHandle[Any]``, without ``mypy --strict``'s "missing type parameters".
``typing.TypeVar`` takes a default only from Python 3.13: type checkers read this
declaration from ``typing_extensions``, whose stubs ship with them (typeshed); at run time
the plain ``TypeVar`` stands, where a default changes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import TypeVar

    T = TypeVar("T", default=Any)
else:
    from typing import TypeVar

    T = TypeVar("T")
