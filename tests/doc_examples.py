"""The Python examples of the README and ``docs/``, extracted and run as programs.

Theory of operation
-------------------
Every fenced ```` ```python ```` block of ``README.md`` and ``docs/**/*.md`` is an
example. An HTML comment on the line(s) just before a block says how it runs::

    (no comment)                      runs on the local backend
    <!-- example: cluster -->         runs in the cluster tier (GKE backend, testbed)
    <!-- example: pytest -->          a test module: run with pytest and kinetic.testing
    <!-- example: skip REASON -->     not a runnable program; REASON is required

A page reads top to bottom like a notebook, so its local blocks run **in order, in one
fresh interpreter**, sharing their names (a later block may use a function an earlier
one defined); the cluster blocks of a page likewise, in another. A block with a
top-level ``await`` runs on the page's one event loop (what Jupyter gives you); the
others run as plain statements, with no loop running. Each pytest block is a test
module of its own. Source lines keep their page's line numbers, so a traceback names
``README.md, line 12``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KINDS = ("local", "cluster", "pytest", "skip")

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^\n`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*example:\s*(?P<kind>[a-z]+)\s*(?P<reason>.*?)\s*-->\s*$")


class ExampleSyntaxError(ValueError):
    """A page's example markers are malformed (unknown kind, skip without a reason)."""


@dataclass(frozen=True)
class Example:
    """One ```python block: where it is, how it runs, and its source (dedented)."""

    page: Path
    line: int  # 1-based line of the block's first source line
    kind: str
    source: str
    reason: str = ""

    @property
    def label(self) -> str:
        page = self.page.relative_to(REPO) if self.page.is_relative_to(REPO) else self.page
        return f"{page}:{self.line}"


def pages() -> list[Path]:
    """The README and every Markdown page under ``docs/``, in a stable order."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def extract(page: Path) -> list[Example]:
    """The Python examples of ``page``, in order.

    :raises ExampleSyntaxError: an unknown marker kind, or ``skip`` without a reason.
    """
    lines = page.read_text(encoding="utf-8").splitlines()
    examples: list[Example] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent = m["fence"], m["indent"]
        language = m["info"].split()[0].lower() if m["info"].strip() else ""
        end = i + 1
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        while end < len(lines) and not closing.match(lines[end]):
            end += 1
        if language in ("python", "py", "python3"):
            body = [ln.removeprefix(indent) for ln in lines[i + 1 : end]]
            kind, reason = _marker_before(lines, i, page)
            examples.append(Example(page, i + 2, kind, "\n".join(body) + "\n", reason))
        i = end + 1
    return examples


def _marker_before(lines: list[str], fence_index: int, page: Path) -> tuple[str, str]:
    j = fence_index - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    m = _MARKER.match(lines[j]) if j >= 0 else None
    if m is None:
        return "local", ""
    kind, reason = m["kind"], m["reason"]
    where = f"{page}:{j + 1}"
    if kind not in KINDS:
        raise ExampleSyntaxError(f"{where}: unknown example kind {kind!r}; use one of {KINDS}")
    if kind == "skip" and not reason:
        raise ExampleSyntaxError(f"{where}: 'example: skip' needs a reason")
    return kind, reason


# The program that runs a page's blocks in one interpreter. It is written next to the
# blocks, so Kinetic finds that directory as the example's project (package root).
_SESSION = textwrap.dedent(
    """
    import ast, asyncio, inspect, json, sys, traceback

    with open(sys.argv[1], encoding="utf-8") as f:
        blocks = json.load(f)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    with asyncio.Runner() as loop:
        for block in blocks:
            # Blank lines in front keep the page's line numbers in tracebacks.
            source = "\\n" * (block["line"] - 1) + block["source"]
            print(f"--- example {block['label']}", flush=True)
            try:
                code = compile(
                    source, block["path"], "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
                )
                if code.co_flags & inspect.CO_COROUTINE:
                    loop.run(eval(code, namespace))
                else:
                    exec(code, namespace)
            except BaseException:
                traceback.print_exc()
                print(f"FAILED: example {block['label']}", file=sys.stderr, flush=True)
                sys.exit(1)
    print("--- all examples passed", flush=True)
    """
)


@dataclass(frozen=True)
class Outcome:
    returncode: int
    output: str


def run_session(
    examples: list[Example], workdir: Path, env: dict[str, str], *, timeout: float = 240
) -> Outcome:
    """Run ``examples`` in order in one fresh interpreter in ``workdir``; never raises
    for a failing example (the outcome says), only for a hung one (``TimeoutExpired``)."""
    import json

    workdir.mkdir(parents=True, exist_ok=True)
    blocks = [
        {"label": e.label, "path": str(e.page), "line": e.line, "source": e.source}
        for e in examples
    ]
    (workdir / "blocks.json").write_text(json.dumps(blocks), encoding="utf-8")
    (workdir / "session.py").write_text(_SESSION, encoding="utf-8")
    proc = subprocess.run(
        # Warnings are errors: an example that warns teaches users to ignore warnings.
        [sys.executable, "-W", "error", "session.py", "blocks.json"],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    returncode = proc.returncode
    if returncode == 0 and "Exception ignored in" in proc.stderr:
        # An unraisable error (an unclosed file, say) passes -W error silently: fail it.
        returncode = 1
    return Outcome(returncode, proc.stdout[-6000:] + proc.stderr[-8000:])


def run_pytest_example(
    example: Example, workdir: Path, env: dict[str, str], *, timeout: float = 240
) -> Outcome:
    """Run a ``pytest`` example as a test module, with the ``kinetic.testing`` plugin."""
    workdir.mkdir(parents=True, exist_ok=True)
    module = workdir / f"test_example_{example.line}.py"
    module.write_text("\n" * (example.line - 1) + example.source, encoding="utf-8")
    proc = subprocess.run(
        # -p names the plugin even where the entry point is not installed (a source tree);
        # the rootdir is the example's own folder, not this project (its pytest settings).
        # The examples' async tests use anyio's plugin; pytest-asyncio (installed with the
        # test extra) is left out: tests/local/test_testing_plugins.py runs its modes.
        [sys.executable, "-m", "pytest", "-p", "kinetic.testing", "-p", "no:asyncio",
         "-q", "-W", "error",
         "--rootdir", str(workdir), "-c", os.devnull, module.name],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )  # fmt: skip
    return Outcome(proc.returncode, proc.stdout[-8000:] + proc.stderr[-4000:])


def clean_environment(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment minus every setting that could choose where jobs go,
    plus ``extra``."""
    from kinetic.testing import CLEARED_PREFIXES

    env = {k: v for k, v in os.environ.items() if not k.startswith(CLEARED_PREFIXES)}
    env.update(extra)
    return env
