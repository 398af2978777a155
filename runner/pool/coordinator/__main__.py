"""``python -m runner.pool.coordinator --storage URL --group GID --host ADDRESS``: a
coordinated pool's coordinator (:func:`runner.pool.coordinator.server.main`)."""

import sys

from runner.pool.coordinator.server import main

sys.exit(main())
