"""``from kinetic.job_status import JobStatus``: the original's import path for the enum."""

from kinetic._core.status import JobStatus

__all__ = ["JobStatus"]
