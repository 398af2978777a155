"""Shared test configuration: environment isolation and the fixture plugins."""

from __future__ import annotations

pytest_plugins = ["tests.fix_env", "tests.fix_gcs", "tests.fix_cluster", "tests.fix_faults"]
