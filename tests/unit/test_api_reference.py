"""docs/api.md and the code agree: every documented signature is the real one, in both
the blocking and the async API, and every public method of the handles is documented."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import kinetic
from kinetic import aio

API_MD = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def _sections() -> dict[str, str]:
    text = API_MD.read_text()
    parts = re.split(r"^## ", text, flags=re.MULTILINE)
    return {p.split("\n", 1)[0].strip(): p for p in parts[1:]}


def _documented(section: str) -> dict[str, str]:
    """name -> parameter list, from table rows and bullets written as `name(params)`."""
    out: dict[str, str] = {}
    for m in re.finditer(r"^(?:\| |- )`(?:f\.)?(\w+)\(([^`]*)\)`", section, flags=re.MULTILINE):
        if m.group(1) != "f":  # `f(*args, **kwargs)`: calling the decorated function itself
            out[m.group(1)] = m.group(2)
    return out


def _normalise(params: str) -> list[str]:
    params = re.sub(r"\s+", " ", params).replace('"', "'")
    return [p.strip() for p in params.split(",") if p.strip()]


def _render(fn: Callable[..., Any]) -> list[str]:
    """The signature as the reference writes it: ``name=default``, ``*`` before keyword-only."""
    out: list[str] = []
    star = False
    for p in inspect.signature(fn).parameters.values():
        if p.name == "self":
            continue
        if p.kind is p.VAR_POSITIONAL:
            out.append(f"*{p.name}")
            star = True
            continue
        if p.kind is p.VAR_KEYWORD:
            out.append(f"**{p.name}")
            continue
        if p.kind is p.KEYWORD_ONLY and not star:
            out.append("*")
            star = True
        out.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
    return out


def _pairs(section: str, blocking: Any, async_: Any) -> list[tuple[str, str, Any, Any]]:
    return [
        (section, name, getattr(blocking, name), getattr(async_, name))
        for name in _documented(_sections()[section])
    ]


CASES = [
    *_pairs("`JobHandle`", kinetic.JobHandle, aio.JobHandle),
    *_pairs("`BatchHandle`", kinetic.BatchHandle, aio.BatchHandle),
    *_pairs("`RemoteFunction`", kinetic.RemoteFunction, aio.RemoteFunction),
    *_pairs("Functions", kinetic, aio),
]


@pytest.mark.parametrize(
    ("section", "name", "blocking", "async_"), CASES, ids=[f"{c[0]}.{c[1]}" for c in CASES]
)
def test_documented_signature_is_the_real_one(
    section: str, name: str, blocking: Any, async_: Any
) -> None:
    documented = _normalise(_documented(_sections()[section])[name])
    assert _render(blocking) == documented
    assert _render(async_) == documented


def test_run_signature_is_the_documented_one() -> None:
    block = _sections()["`kinetic.run(...)`"]
    m = re.search(r"```python\nrun\((.*?)\)\n```", block, flags=re.DOTALL)
    assert m is not None
    documented = _normalise(m.group(1))
    assert _render(kinetic.run) == documented
    assert _render(aio.run) == documented


@pytest.mark.parametrize(
    ("section", "cls"), [("`JobHandle`", kinetic.JobHandle), ("`BatchHandle`", kinetic.BatchHandle)]
)
def test_every_public_method_is_documented(section: str, cls: type) -> None:
    documented = set(_documented(_sections()[section]))
    public = {
        n
        for n, v in vars(cls).items()
        if not n.startswith("_") and callable(v) and not isinstance(v, classmethod)
    }
    assert public - documented == set()


def test_the_originals_job_status_import_path_works() -> None:
    from kinetic.job_status import JobStatus

    assert JobStatus is kinetic.JobStatus
    assert {s.value for s in JobStatus} >= {"PENDING", "RUNNING", "SUCCEEDED", "FAILED"}
