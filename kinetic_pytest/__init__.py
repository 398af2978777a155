"""The ``pytest11`` entry point of kinetic-aio: :mod:`kinetic.testing`'s fixture, cheap.

pytest loads an installed plugin in every session of the environment, whether its tests
use Kinetic or not. Loading :mod:`kinetic.testing` there imports the whole ``kinetic``
package (about a hundred modules, 150-250 ms a session). This module is what the entry
point names instead: it defines the fixture with pytest alone, and imports Kinetic when
a test asks for it. The plugin's name stays ``kinetic.testing`` (``-p no:kinetic.testing``
turns it off); ``pytest_plugins = ["kinetic.testing"]`` and ``-p kinetic.testing`` load
the full module, which defines the same fixture.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from kinetic.testing import LocalKinetic


@pytest.fixture
def kinetic_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalKinetic]:
    """Run this test's Kinetic jobs on the local backend, under a temporary root (see
    :func:`kinetic.testing.kinetic_local`, which this is)."""
    from kinetic.testing import local_kinetic

    yield from local_kinetic(tmp_path, monkeypatch)
