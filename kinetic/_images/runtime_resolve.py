"""Resolving an image's runtime and the project's lines for Linux x86-64, at submission.

:func:`resolve_runtime` turns a :class:`~kinetic._core.accel_runtime.RuntimeRequest`
into the exact set of distributions the runtime layer installs (JAX for the category,
its plugin or ``libtpu``, Keras, Kinetic's own pinned dependencies and every
dependency of theirs), :func:`check_project` checks that the project's own lines
install on top of that set without changing it, and :func:`check_kept` that the lines
marked ``# kn:keep`` (installed as written, free of the runtime's pins) have a set of
their own. All run before anything is built or uploaded, for the image's platform (not
this machine's), and fail with
:class:`~kinetic.RuntimeConflictError` naming the line, the platform and the
resolver's reason.

The resolver is ``uv pip compile`` when uv is installed (next to this interpreter or on
``PATH``; it reads uv's index settings, ``UV_INDEX_URL`` / ``UV_DEFAULT_INDEX``), else
``pip install --dry-run --report`` (pip's settings). Both take only binary wheels: the
image's build installs wheels (shipped in its context on the wheels path, fetched from
the index inside the build on the index path, :mod:`kinetic._images.index_build`). Results are cached under
``~/.cache/kinetic/resolved/`` (``KINETIC_RESOLVE_CACHE``): for good where every input
line is an exact ``==`` pin, for a day otherwise. Blocking functions; async callers run
them in a worker thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from kinetic._core import image_spec
from kinetic._core.accel_runtime import PLATFORM, RuntimeLine, RuntimeRequest
from kinetic._core.requirements import Requirement
from kinetic._exceptions import RuntimeConflictError

__all__ = ["ResolvedRuntime", "check_kept", "check_project", "resolve", "resolve_runtime"]

MANYLINUX = "manylinux_2_34"
"""The newest glibc the images' wheels may need (the default base image has 2.36)."""
PIP_PLATFORMS = (
    "manylinux2014_x86_64",
    *(f"manylinux_2_{minor}_x86_64" for minor in range(17, 35)),
    "linux_x86_64",
)
"""pip's ``--platform`` tags for the same range (pip does not widen an explicit one)."""
RESOLVE_TIMEOUT = 900.0
UNPINNED_TTL = 86400.0
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*$")
_EXACT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[^\]]*\])?==[^,;*]+$")
_MEMO: dict[str, tuple[str, ...]] = {}


class ResolutionFailed(Exception):
    """The resolver found no set; the message is its reason."""


@dataclass(frozen=True)
class ResolvedRuntime:
    """The exact runtime set of an image.

    :ivar pins: ``name==version`` of every distribution in it, sorted by name.
    """

    category: str
    python: str
    pins: tuple[str, ...]

    def version(self, name: str) -> str | None:
        """The version of distribution ``name`` in the set, or None."""
        want = canonicalize_name(name)
        for pin in self.pins:
            dist, _, version = pin.partition("==")
            if canonicalize_name(dist) == want:
                return version
        return None


def cache_dir() -> Path:
    env = os.environ.get("KINETIC_RESOLVE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "kinetic" / "resolved"


def find_uv() -> str | None:
    from runner.install import find_uv as runner_find_uv

    return runner_find_uv()


def uv_command(uv: str, python: str, req: Path, constraints: Path | None) -> list[str]:
    cmd = [uv, "pip", "compile", "--quiet", "--no-header", "--no-annotate"]
    cmd += ["--python-platform", f"x86_64-{MANYLINUX}"]
    cmd += ["--python-version", image_spec.resolver_python(python)]
    cmd += ["--only-binary", ":all:", str(req)]
    return [*cmd, "-c", str(constraints)] if constraints else cmd


def _pip_command(python: str, req: Path, constraints: Path | None, report: Path) -> list[str]:
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
    cmd += ["--disable-pip-version-check", "--report", str(report), "--only-binary=:all:"]
    cmd += ["--python-version", image_spec.resolver_python(python), "--implementation", "cp"]
    for platform in PIP_PLATFORMS:
        cmd += ["--platform", platform]
    cmd += ["--target", str(report.parent / "target"), "-r", str(req)]
    return [*cmd, "-c", str(constraints)] if constraints else cmd


def reason(text: str) -> str:
    """The last lines of a resolver's error output that say something."""
    lines = [
        line
        for line in text.strip().splitlines()
        if line.strip() and "is ignored: it is neither a file nor a directory" not in line
    ]
    return "\n".join(lines[-25:])


@contextlib.contextmanager
def requirement_files(
    lines: Sequence[str], constraints: Sequence[str]
) -> Iterator[tuple[Path, Path | None]]:
    """``lines`` and ``constraints`` (None when empty) written to requirement files in a
    temporary folder, removed after the block."""
    with tempfile.TemporaryDirectory(prefix="kinetic-resolve-") as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text("".join(f"{line}\n" for line in lines))
        cons = None
        if constraints:
            cons = Path(tmp) / "constraints.txt"
            cons.write_text("".join(f"{line}\n" for line in constraints))
        yield req, cons


def run_resolver(cmd: Sequence[str]) -> str:
    """Run the resolver command ``cmd``; return its standard output.

    :raises ResolutionFailed: it failed (the message is its reason) or took over
        :data:`RESOLVE_TIMEOUT` seconds.
    """
    try:
        proc = subprocess.run(
            list(cmd),
            check=False,
            capture_output=True,
            text=True,
            timeout=RESOLVE_TIMEOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "UV_NO_PROGRESS": "1"},
        )
    except subprocess.TimeoutExpired as exc:
        raise ResolutionFailed(f"the resolver took over {RESOLVE_TIMEOUT:.0f}s") from exc
    if proc.returncode != 0:
        raise ResolutionFailed(reason(proc.stderr or proc.stdout))
    return proc.stdout


def _run(lines: Sequence[str], python: str, constraints: Sequence[str]) -> tuple[str, ...]:
    with requirement_files(lines, constraints) as (req, cons):
        uv = find_uv()
        report = req.parent / "report.json"
        cmd = uv_command(uv, python, req, cons) if uv else _pip_command(python, req, cons, report)
        stdout = run_resolver(cmd)
        if uv:
            pins = [m.group(0).strip() for m in map(_PIN.match, stdout.splitlines()) if m]
        else:
            data = json.loads(report.read_text())
            pins = [
                f"{item['metadata']['name']}=={item['metadata']['version']}"
                for item in data.get("install", [])
            ]
    return tuple(sorted({_canonical_pin(p) for p in pins}))


def is_exact(line: str) -> bool:
    """Whether requirement ``line`` pins one version (``name==version``, markers aside)."""
    return _EXACT.match(line.split(";")[0].strip()) is not None


def _canonical_pin(pin: str) -> str:
    name, _, version = pin.partition("==")
    return f"{canonicalize_name(name)}=={version}"


def resolve(lines: Sequence[str], python: str, constraints: Sequence[str] = ()) -> tuple[str, ...]:
    """The exact set (``name==version``, sorted) that installs ``lines`` under
    ``constraints`` on Linux x86-64 with CPython ``python``. Cached. Blocking.

    :raises ResolutionFailed: no such set (the message is the resolver's reason).
    """
    key_text = json.dumps([MANYLINUX, python, list(lines), list(constraints), bool(find_uv())])
    key = hashlib.sha256(key_text.encode()).hexdigest()[:24]
    if key in _MEMO:
        return _MEMO[key]
    path = cache_dir() / f"{key}.json"
    exact = all(is_exact(line) for line in lines)
    try:
        fresh = exact or time.time() - path.stat().st_mtime < UNPINNED_TTL
        if fresh:
            pins = tuple(json.loads(path.read_text())["pins"])
            _MEMO[key] = pins
            return pins
    except (OSError, ValueError, KeyError, TypeError):
        pass
    pins = _run(lines, python, constraints)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"lines": list(lines), "python": python, "pins": list(pins)}))
        tmp.replace(path)
    except OSError:
        pass  # a cache that cannot be written only costs the next submission a resolution
    _MEMO[key] = pins
    return pins


def _where(python: str) -> str:
    return f"{PLATFORM}, Python {python}"


def _describe(line: RuntimeLine, category: str) -> str:
    assert line.origin is not None
    text = f"{line.origin.source}: {line.origin.line!r}"
    if line.line != line.origin.line:
        text += f" (installed as {line.line!r} on {category.upper()})"
    return text


def resolve_runtime(
    request: RuntimeRequest, python: str, kinetic_lines: Sequence[str] = ()
) -> ResolvedRuntime:
    """The exact runtime set of ``request`` with Kinetic's own ``kinetic_lines``. Blocking.

    :raises RuntimeConflictError: naming the user's runtime lines (or, with none, the
        defaults), the platform and the resolver's reason.
    """
    try:
        pins = resolve([*request.runtime_lines, *kinetic_lines], python)
    except ResolutionFailed as exc:
        category = request.category
        mine = request.user_runtime
        if mine:
            named = "; ".join(_describe(line, category) for line in mine)
            head = f"{named}: cannot be installed for a {category.upper()} job"
        else:
            head = (
                f"the default {category.upper()} runtime "
                f"({', '.join(request.runtime_lines)}) cannot be installed"
            )
        raise RuntimeConflictError(
            f"{head} on {_where(python)} together with Keras and Kinetic's runner:\n{exc}"
        ) from None
    return ResolvedRuntime(request.category, python, pins)


def _mentioned(reqs: Iterable[Requirement], reason: str) -> list[Requirement]:
    text = reason.lower().replace("_", "-")
    out = []
    for req in reqs:
        if req.name and re.search(rf"(?<![a-z0-9.-]){re.escape(req.name)}(?![a-z0-9-])", text):
            out.append(req)
    return out


def checkable(reqs: Iterable[Requirement]) -> list[Requirement]:
    """The lines a resolver can judge here: requirements by name (not URLs, paths or
    per-line options) and index options."""
    from kinetic._core.requirements import packaging_requirement

    out = []
    for req in reqs:
        if req.line.startswith(image_spec.INDEX_OPTIONS):
            out.append(req)
            continue
        if req.name is None or req.line.startswith("-") or " --" in req.line:
            continue
        spec = packaging_requirement(req)
        if spec is not None and not spec.url:
            out.append(req)
    return out


def _check(
    reqs: Sequence[Requirement],
    runtime: ResolvedRuntime,
    *,
    options: Sequence[str] = (),
    constraints: Sequence[str] = (),
    what: str,
) -> None:
    """Resolve ``reqs`` (after ``options``) under ``constraints`` for ``runtime``'s
    platform; on failure name the lines the reason mentions (or all), ``what`` after them.

    :raises RuntimeConflictError: no set.
    """
    if not any(r.name for r in reqs):
        return
    try:
        resolve([*options, *(r.line for r in reqs)], runtime.python, constraints)
    except ResolutionFailed as exc:
        culprits = _mentioned(reqs, str(exc)) or [r for r in reqs if r.name]
        named = "; ".join(f"{r.source}: {r.line!r}" for r in culprits)
        raise RuntimeConflictError(
            f"{named}{what.format(category=runtime.category.upper(), where=_where(runtime.python))}"
            f":\n{exc}"
        ) from None


def check_project(runtime: ResolvedRuntime, project: Sequence[Requirement]) -> None:
    """Check that ``project``'s lines install on top of ``runtime`` without changing it.
    Blocking.

    :raises RuntimeConflictError: naming the lines the resolver's reason mentions (or all
        of them), the platform and the reason.
    """
    what = (
        ": cannot be installed for a {category} job on {where} next to its runtime (JAX, "
        "Keras and Kinetic's runner, pinned)"
    )
    _check(checkable(project), runtime, constraints=runtime.pins, what=what)


def check_kept(
    runtime: ResolvedRuntime, kept: Sequence[Requirement], project: Sequence[Requirement] = ()
) -> None:
    """Check that the ``# kn:keep`` lines install for the image's platform on their own:
    they are the user's override, installed after the runtime and not held to its pins,
    so only whether they can be installed at all is judged (with the index options of
    ``project``, which the image's downloads use too). Blocking.

    :raises RuntimeConflictError: naming the kept lines the resolver's reason mentions
        (or all of them), the platform and the reason.
    """
    options = image_spec.index_options([r.line for r in project])
    what = " (marked `# kn:keep`): cannot be installed for a {category} job on {where}"
    _check(checkable(kept), runtime, options=options, what=what)
