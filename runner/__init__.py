"""What runs inside a Kinetic job: fetch, verify, unpack, run, record.

This package is deliberately small and imports almost nothing at start-up
(``cloudpickle`` and the standard library), so a job on the local backend
starts as fast as a bare interpreter. It never imports ``kinetic``: a ``gs://``
store is a plug-in that the runner's launcher names (:mod:`runner.store`); Kinetic's
launchers name Kinetic's own GCS store, on a private loop, rather than a second client.

Modules without a leading underscore (``protocol``, ``job``, ``fs``, ``store``,
``results_log``, ``walk``, ``contexts``, ``data``, ...) are the ones Kinetic's client
side shares; ``_main``, ``_member`` and ``_tee`` are the runner's own.

The name ``runner`` is also an unrelated project's on the package index: installed in
the same environment, it would overwrite or shadow this package. :data:`KINETIC_RUNNER`
marks this one; ``import kinetic`` and ``python -m runner`` refuse a ``runner``
without it, saying so (docs/architecture.md, "Packaging notes").
"""

import os as _os
import sys as _sys

KINETIC_RUNNER = 1
"""The mark of Kinetic's runner (a version of the runner protocol's layout)."""

DEPS_ENV = "KINETIC_RUNNER_DEPS"
"""A folder of the runner's dependencies that the image lacks, delivered with a job in a
custom image (:mod:`kinetic._core.runner_delivery`): appended to ``sys.path`` here,
before anything of the runner imports them, so the image's own packages come first."""

_deps = _os.environ.get(DEPS_ENV)
if _deps and _deps not in _sys.path:
    _sys.path.append(_deps)
