"""``python -m kinetic``: the ``kinetic`` command."""

import sys

from kinetic._cli import main

sys.exit(main())
