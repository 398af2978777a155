"""The variables ``capture_env_vars`` sends with a job, and the one warning about them.

Captured variables travel in plain text and rest in the job's spec in storage and, on
GKE, in the Job's manifest (docs/security.md). A name that looks like a secret is
worth one line the first time it is sent from a process.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from kinetic._core.config import capture_env, secret_like

logger = logging.getLogger(__name__)

_warned: set[str] = set()
_warned_lock = threading.Lock()


def capture_job_env(patterns: list[str] | None, environ: Mapping[str, str]) -> dict[str, str]:
    """:func:`~kinetic._core.config.capture_env`, warning once per process for each
    captured name that looks like a secret.

    :raises ConfigError: when ``patterns`` is not a list of strings.
    """
    env = capture_env(patterns, environ)
    with _warned_lock:
        new = [name for name in secret_like(env) if name not in _warned]
        _warned.update(new)
    if new:
        logger.warning(
            "capture_env_vars sends %s in plain text: it rests in the job's spec in "
            "its storage and, on GKE, in the Job's manifest, readable by whoever can read "
            "those (docs/security.md)",
            ", ".join(new),
        )
    return env
