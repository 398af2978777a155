"""``python -m kinetic._cli``: the ``kinetic`` command."""

import sys

from kinetic._cli import main

sys.exit(main())
