"""Which stores the runner gets beyond ``file://``: Kinetic's, named by its launchers.

The runner never imports Kinetic (:mod:`runner.store`): the process that starts it
names, in :data:`runner.store.STORES_ENV`, the modules that register its other stores.
Every launcher of Kinetic's (the local backend's processes, the cluster backends' pods)
names Kinetic's GCS store, :mod:`kinetic._storage.runner_gcs`: the runner runs where
Kinetic is installed (the submitting interpreter, or an image that carries Kinetic).
"""

from __future__ import annotations

from runner.store import STORES_ENV

GCS_STORE = "kinetic._storage.runner_gcs"
"""Kinetic's ``gs://`` store for the runner."""

RUNNER_ENV: dict[str, str] = {STORES_ENV: GCS_STORE}
"""What a launcher adds to the runner's environment."""
