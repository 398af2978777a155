"""What one ``kinetic doctor`` check ends with: a pure value, below every doctor module.

:mod:`kinetic._cli.doctor` renders these, :mod:`kinetic._cli.doctor_checks` and
:mod:`kinetic._cli.doctor_identity` make them; none of them imports another for it.
"""

from __future__ import annotations

from dataclasses import dataclass

LEVELS = ("ok", "warn", "fail", "skip")


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check.

    :ivar name: the check (``cluster``, ``bucket``, ...).
    :ivar level: one of :data:`LEVELS`.
    :ivar detail: what was seen.
    :ivar hint: how to fix it (None when ``ok``).
    """

    name: str
    level: str
    detail: str
    hint: str | None = None

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"unknown check level {self.level!r}")


def ok(name: str, detail: str) -> CheckResult:
    return CheckResult(name, "ok", detail)


def warn(name: str, detail: str, hint: str | None = None) -> CheckResult:
    return CheckResult(name, "warn", detail, hint)


def fail(name: str, detail: str, hint: str | None = None) -> CheckResult:
    return CheckResult(name, "fail", detail, hint)


def skip(name: str, detail: str) -> CheckResult:
    return CheckResult(name, "skip", detail)
