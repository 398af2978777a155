"""Kinetic's job runner is the top-level package ``runner``, a name an unrelated
project on the package index also uses. Installed beside kinetic-aio (or a ``runner/``
or ``runner.py`` on ``PYTHONPATH``), that one shadows or overwrites Kinetic's, and the
first ``from runner import protocol`` failed with a puzzling ImportError. Imported
first by ``kinetic/__init__.py``, this module makes that a clear one.
(``runner/__main__.py`` says the same in a job whose ``runner/__init__.py`` another
package overwrote.)
"""

from __future__ import annotations

import runner

SHADOWED = (
    "the `runner` package at {where} is not Kinetic's job runner (kinetic-aio installs "
    "its own top-level `runner` package): another package of that name shadows or "
    "overwrote it, such as the unrelated `runner` project on the package index, or a "
    "runner/ or runner.py on PYTHONPATH. Remove or rename it (`pip uninstall runner`), "
    "then reinstall kinetic-aio"
)

if getattr(runner, "KINETIC_RUNNER", None) is None:
    where = getattr(runner, "__file__", None) or "?"
    raise ImportError(SHADOWED.format(where=where), name="runner", path=where)
