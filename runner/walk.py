"""Replace chosen leaves inside nested arguments, rebuilding containers with their types.

Both sides of a job use it: the submitter turns each ``kinetic.Data`` into a
reference, the runner turns each reference into a local path. Lists, tuples
(named tuples included) and dicts (``OrderedDict``, ``defaultdict`` and other
subclasses included) are walked at any depth; a container without a match is
returned as is, so untouched arguments keep their identity. Sets and dict keys
cannot hold a match (a path is not a stable key): that raises ``TypeError``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

_MISSING = object()


def replace_leaves(obj: Any, match: Callable[[Any], bool], replace: Callable[[Any], Any]) -> Any:
    """Return ``obj`` with every leaf for which ``match`` is true replaced by ``replace(leaf)``.

    :raises TypeError: when a match sits in a set/frozenset or is used as a dict key.
    """
    out = _walk(obj, match, replace)
    return obj if out is _MISSING else out


def _walk(obj: Any, match: Callable[[Any], bool], replace: Callable[[Any], Any]) -> Any:
    """The replaced object, or ``_MISSING`` when nothing inside ``obj`` matched."""
    if match(obj):
        return replace(obj)
    if isinstance(obj, (str, bytes, int, float, bool, type(None))):
        return _MISSING
    if isinstance(obj, (list, tuple)):
        items = [_walk(x, match, replace) for x in obj]
        if all(x is _MISSING for x in items):
            return _MISSING
        new = [obj[i] if x is _MISSING else x for i, x in enumerate(items)]
        return _rebuild_sequence(obj, new)
    if isinstance(obj, dict):
        if any(match(k) for k in obj):
            raise TypeError("a kinetic.Data cannot be a dict key")
        values = {k: _walk(v, match, replace) for k, v in obj.items()}
        if all(v is _MISSING for v in values.values()):
            return _MISSING
        pairs = [(k, obj[k] if v is _MISSING else v) for k, v in values.items()]
        return _rebuild_mapping(obj, pairs)
    if isinstance(obj, (set, frozenset)):
        if any(match(x) for x in obj):
            raise TypeError("a kinetic.Data cannot be in a set (it is replaced by a path)")
        return _MISSING
    return _MISSING


def _rebuild_sequence(original: list[Any] | tuple[Any, ...], items: list[Any]) -> Any:
    cls = type(original)
    if cls is list:
        return items
    if cls is tuple:
        return tuple(items)
    if isinstance(original, tuple) and hasattr(cls, "_make"):  # a named tuple
        return cls._make(items)
    try:
        return cls(items)
    except Exception:  # noqa: BLE001 - an exotic subclass: fall back to its base type
        return tuple(items) if isinstance(original, tuple) else items


def _rebuild_mapping(original: dict[Any, Any], pairs: list[tuple[Any, Any]]) -> Any:
    cls = type(original)
    if cls is dict:
        return dict(pairs)
    if isinstance(original, defaultdict):
        rebuilt = type(original)(original.default_factory)
        rebuilt.update(pairs)
        return rebuilt
    try:
        return cls(pairs)
    except Exception:  # noqa: BLE001 - an exotic subclass: fall back to dict
        return dict(pairs)
