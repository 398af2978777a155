"""Install a job's requirements at start with uv (prebuilt mode), before unpickling.

Prebuilt base images (``kinetic build-image``) carry ``uv`` next to the venv's
interpreter. The requirement lines travel in the job spec; they are installed into
the running interpreter's environment from whatever package index the pod's
environment names (``UV_INDEX_URL`` / ``UV_DEFAULT_INDEX``, ``UV_EXTRA_INDEX_URL``, or
the lines' own ``--index-url``). uv's output goes to the job's log; a failure or a
run past ``KINETIC_INSTALL_TIMEOUT`` seconds (default 900) is a
:class:`~runner.protocol.PhaseError` in phase ``install`` carrying uv's message, never a
hang. Standard library only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from runner.protocol import PhaseError

DEFAULT_TIMEOUT = 900.0


def find_uv() -> str | None:
    """uv next to this interpreter (the image's venv), else on ``PATH``."""
    beside = Path(sys.executable).with_name("uv")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("uv")


def install_requirements(lines: Sequence[str], workdir: Path, *, kept: bool = False) -> None:
    """``uv pip install`` the lines into this interpreter's environment.

    :param kept: the lines are the job's ``# kn:keep`` ones, installed after the others
        in a run of their own (so they may replace what the image or that run installed).
    :raises PhaseError: (phase ``install``) uv is missing, failed, or timed out.
    """

    uv = find_uv()
    if uv is None:
        raise PhaseError(
            "install",
            "this job has requirements to install, but its image has no uv: prebuilt mode "
            "needs a base image made by `kinetic build-image`",
        )
    req_file = workdir / ("kinetic-kept.txt" if kept else "kinetic-requirements.txt")
    req_file.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    env = dict(os.environ)
    env.setdefault("UV_CACHE_DIR", str(workdir / "uv-cache"))
    timeout = float(os.environ.get("KINETIC_INSTALL_TIMEOUT") or DEFAULT_TIMEOUT)
    cmd = [uv, "pip", "install", "--python", sys.executable, "-r", str(req_file)]
    what = "line(s) marked kn:keep, as written," if kept else "requirement(s)"
    print(f"kinetic runner: installing {len(lines)} {what} with uv", file=sys.stderr)
    try:
        proc = subprocess.run(
            cmd,
            check=False,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        raise PhaseError("install", f"uv pip install did not finish within {timeout:.0f}s") from exc
    except OSError as exc:
        raise PhaseError("install", f"cannot run uv ({uv}): {exc}") from exc
    sys.stderr.write(proc.stdout + proc.stderr)
    sys.stderr.flush()
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-30:])
        raise PhaseError("install", f"uv pip install failed (exit {proc.returncode}):\n{tail}")
    # What was just installed must be importable by the unpickling that follows.
    import importlib

    importlib.invalidate_caches()
